"""Disaggregated prefill with its two engines started apart (`rlt-serve --role prefill|decode`).

An engine started with ``role="prefill"`` or ``"decode"`` listens on ``role_address`` for one front
end (`rlt-serve --disaggregated-prefill --prefill-address HOST:PORT --decode-address HOST:PORT`, or
`LLM(..., disaggregated_prefill=True, prefill_address=..., decode_address=...)`), which proves
it holds the shared key in $RLT_ROLE_KEY (multiprocessing's HMAC handshake). From then on the engine
serves exactly what a role process of the single-host launcher serves (process_replica.py's
protocol with disaggregated.py's RoleHooks), over TCP instead of a pipe, and joins the K/V transfer
group at ``kv_transfer_address``, whose rendezvous the prefill engine hosts. The engine ends when
its front end disconnects or stops it. Outputs are bit for bit those of one engine, as with the
launcher: the same options build the same engines, only the processes start elsewhere.
"""

from __future__ import annotations

import logging
import multiprocessing.connection
import os
import signal

import torch

from ..config import EngineConfig, parse_address
from ..errors import ConfigError
from .disaggregated import RoleHooks, role_options
from .process_replica import replica_main

logger = logging.getLogger("rlt")

ROLE_KEY_ENV = "RLT_ROLE_KEY"


def role_key() -> bytes:
    """The shared secret a front end and its engines authenticate each other with."""
    key = os.environ.get(ROLE_KEY_ENV)
    if not key:
        raise ConfigError(f"engines started apart and their front end authenticate each other with a shared key: "
                          f"set ${ROLE_KEY_ENV} to the same secret for the front end and both engines")
    return key.encode()


class RemoteProcess:
    """Stands in for the process of an engine started apart: the connection is all the front end
    has of it (it cannot join or kill it; `kill` closes the connection, which ends the engine)."""

    pid = None
    exitcode = None

    def __init__(self, conn):
        self._conn = conn

    def is_alive(self) -> bool:
        return not self._conn.closed

    def join(self, timeout=None) -> None:
        pass

    def kill(self) -> None:
        self._conn.close()


def connect_role(role: str, address: str) -> tuple:
    """(connection, RemoteProcess) to the `role` engine listening at address."""
    host, port = parse_address(address, f"{role}_address")
    key = role_key()
    try:
        conn = multiprocessing.connection.Client((host, port), authkey=key)
    except (OSError, EOFError, multiprocessing.AuthenticationError) as exc:
        raise ConfigError(f"cannot reach the {role} engine at {address} ({type(exc).__name__}: {exc}); start it with "
                          f"rlt-serve --role {role} --role-address {address} and the same ${ROLE_KEY_ENV}") from None
    return conn, RemoteProcess(conn)


def role_device(cfg: EngineConfig) -> str:
    """The device an engine serving a role runs on: device='cuda:K' as given, 'cuda' (or 'auto' with
    CUDA) cuda:0, else the CPU (its tensor-parallel ranks take the GPUs from there on)."""
    if cfg.device.startswith("cuda:"):
        return cfg.device
    if cfg.device == "cuda" or (cfg.device == "auto" and torch.cuda.is_available()):
        return "cuda:0"
    return "cpu"


def _accept(listener, role: str):
    """The first front end that proves it holds the key (others are refused and logged)."""
    while True:
        try:
            return listener.accept()
        except (multiprocessing.AuthenticationError, EOFError, OSError) as exc:
            logger.warning("the %s engine refused a front end from %s: %s", role, listener.last_accepted, exc)


def serve_role(model: str, **options) -> int:
    """Build and serve the engine of ``options["role"]`` to one front end; returns the engine
    process's exit status. The engine runs in a child process, as under the single-host launcher,
    so that this process keeps its signals: an interrupt stops the engine."""
    cfg = EngineConfig.from_kwargs(**options)
    cfg.validate_static()
    if cfg.role is None:
        raise ConfigError("serve_role needs role='prefill' or 'decode'")
    key = role_key()
    address = parse_address(cfg.role_address, "role_address")
    kv_host, kv_port = parse_address(cfg.kv_transfer_address, "kv_transfer_address")
    device = role_device(cfg)
    engine_options = role_options(cfg, cfg.role)
    with multiprocessing.connection.Listener(address, authkey=key) as listener:
        logger.info("the %s engine waits for its front end on %s", cfg.role, cfg.role_address)
        conn = _accept(listener, cfg.role)
    logger.info("the %s engine's front end connected; building the engine on %s", cfg.role, device)
    context = torch.multiprocessing.get_context("spawn")
    threads = max(1, (os.cpu_count() or 1) // 2)
    hooks = RoleHooks(cfg.role, device, f"tcp://{kv_host}:{kv_port}")
    child = context.Process(target=replica_main, args=(conn, model, engine_options, device, threads, hooks),
                            name=f"rlt-{cfg.role}")
    child.start()
    conn.close()
    try:
        child.join()
    except KeyboardInterrupt:
        child.terminate()
        child.join(10)
    if child.exitcode is None:
        os.kill(child.pid, signal.SIGKILL)
        child.join()
    return child.exitcode or 0


__all__ = ["ROLE_KEY_ENV", "RemoteProcess", "connect_role", "role_device", "role_key", "serve_role"]
