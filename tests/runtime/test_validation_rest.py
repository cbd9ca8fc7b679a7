"""perf.validation_rest: which GPU tests and matrix cases an earlier validation left unfinished."""

import json

from perf.validation_rest import finished_tests, main, unfinished_tests, unrun_cases

XDIST_LOG = """\
tests/kernels/test_a.py::test_one[16-16-128]
[gw2] [ 10%] PASSED tests/kernels/test_a.py::test_one[16-16-128] 
tests/kernels/test_rope.py::test_fused[huginn gptj bias-16] 
[gw0] [ 60%] PASSED tests/kernels/test_rope.py::test_fused[huginn gptj bias-16] 
[gw1] [ 61%] FAILED tests/kernels/test_a.py::test_two 
[gw3] [ 62%] SKIPPED tests/kernels/test_flash.py::test_gpu[8-8-64] 
tests/runtime/test_b.py::test_still_running 
"""
PLAIN_LOG = """\
tests/kernels/test_a.py::test_one[16-16-128] PASSED                      [ 50%]
tests/kernels/test_rope.py::test_fused[huginn gptj bias-16] ERROR        [100%]
"""
COLLECTED = ["tests/kernels/test_a.py::test_one[16-16-128]", "tests/kernels/test_rope.py::test_fused[huginn gptj bias-16]",
             "tests/kernels/test_a.py::test_two", "tests/kernels/test_flash.py::test_gpu[8-8-64]",
             "tests/runtime/test_b.py::test_still_running", "tests/runtime/test_b.py::test_never_started"]


def test_tests_with_a_result_are_finished_whatever_the_result():
    assert unfinished_tests(XDIST_LOG, COLLECTED) == ["tests/runtime/test_b.py::test_still_running",
                                                       "tests/runtime/test_b.py::test_never_started"]


def test_ids_with_spaces_in_both_log_formats():
    assert finished_tests(PLAIN_LOG) == {"tests/kernels/test_a.py::test_one[16-16-128]",
                                         "tests/kernels/test_rope.py::test_fused[huginn gptj bias-16]"}


def test_only_cases_whose_last_line_is_not_run(tmp_path, capsys):
    rows = [{"id": "c003", "status": "not-run"}, {"id": "c001", "status": "pass"}, {"id": "c002", "status": "fail"},
            {"id": "c001", "status": "not-run"}, {"id": "c003", "status": "pass"}, {"id": "c004", "status": "not-run"}]
    jsonl = "\n".join(json.dumps(r) for r in rows) + "\n"
    assert unrun_cases(jsonl) == ["c001", "c004"]
    (tmp_path / "conformance").mkdir()
    (tmp_path / "conformance" / "conformance.jsonl").write_text(jsonl)
    main([str(tmp_path), "--cases"])
    assert capsys.readouterr().out == "c001 \nc004 \n"  # --only arguments that match one id each


def test_nothing_left_prints_nothing(tmp_path, capsys):
    (tmp_path / "conformance").mkdir()
    (tmp_path / "conformance" / "conformance.jsonl").write_text(json.dumps({"id": "c000", "status": "pass"}) + "\n")
    main([str(tmp_path), "--cases"])
    assert capsys.readouterr().out == ""  # an empty line would become `--only ""`, which matches every case
