"""rlt: serving looped (recurrent-depth) language models."""

from setuptools import find_packages, setup

setup(
    name="rlt",
    version="0.1.0",
    description="Fast, reproducible inference for looped language models (Ouro, Huginn)",
    long_description=open("README.md", encoding="utf-8").read(),
    long_description_content_type="text/markdown",
    license="Apache-2.0",
    python_requires=">=3.10",
    packages=find_packages(include=["rlt_kernels", "rlt_kernels.*", "rlt_runtime", "rlt_runtime.*"]),
    install_requires=[
        "torch>=2.5",
        "triton>=3.1; platform_system == 'Linux'",
        "numpy>=1.24",
        "safetensors>=0.4.3",
        "tokenizers>=0.19",
        "transformers>=4.45",
        "huggingface_hub>=0.25",
        "jinja2>=3.1",
        "tqdm>=4.66",
    ],
    extras_require={
        "test": [
            "pytest>=8",
            "hypothesis>=6.100",
            "pytest-benchmark>=4",
            "openai>=1.40",
            "httpx>=0.27",
            "schemathesis>=3.30",
            "fastapi>=0.110",
            "uvicorn>=0.29",
            "pydantic>=2.6",
            "prometheus-client>=0.20",
            "xgrammar>=0.1.21",  # the structured-output tests
        ],
        "structured": ["xgrammar>=0.1.21"],  # guided decoding: SamplingParams(guided=...), response_format
        "serve": [
            "fastapi>=0.110",
            "uvicorn>=0.29",
            "pydantic>=2.6",
            "prometheus-client>=0.20",
            "httpx>=0.27",
        ],
        "flash": ["flash-attn>=2.6"],
        # The real clients' end-to-end tests (tests/server/test_lm_eval.py, tests/server/test_real_clients.py)
        "clients": ["lm_eval[api]>=0.4.8", "pyyaml>=6", "langchain-openai>=1.7", "litellm>=1.110", "guidellm>=0.8.1",
                    "aiperf>=0.13", "jsonschema>=4", "openai-agents>=0.24"],
        "plot": ["matplotlib>=3.8"],
        "ray": ["ray[data]>=2.40"],  # distributed_executor="ray" (replicas as Ray actors) and rlt-batch (Ray Data)
    },
    entry_points={
        "console_scripts": [
            "rlt-generate=rlt_runtime.entrypoints.cli:main",
            "rlt-serve=rlt_runtime.entrypoints.server.cli:main",
            "rlt-bench=rlt_runtime.entrypoints.bench:main",
            "rlt-batch=rlt_runtime.entrypoints.ray_batch:main",
        ]
    },
)
