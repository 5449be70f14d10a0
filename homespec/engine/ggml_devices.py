"""llama.cpp's device list and its RPC backend, through ggml's C API (ctypes).

llama-cpp-python binds llama.h only; the devices a model may use and the RPC backend live in
ggml-backend.h and ggml-rpc.h, in the libggml that the loaded libllama links. This module opens
that same library (never a second copy), so the RPC client here, the RPC server `homespec
worker` runs, and the model loader all speak one protocol version by construction.

Facts this code relies on (ggml-rpc.cpp, llama.cpp of llama-cpp-python 0.3.36):
- connecting to an endpoint that does not answer, or answers another protocol version, aborts
  the process (GGML_ABORT): probe a worker in a throwaway process first (engine/rpc_query.py);
- a worker serves one client connection at a time; a second client waits in its backlog;
- a worker lost mid-decode aborts the client process too: that is why engines are child
  processes, and the daemon re-plans the pair when one dies that way.
"""

from __future__ import annotations

import ctypes
import signal
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from homespec.errors import EngineError

_DEV_TYPES = {0: "cpu", 1: "gpu", 2: "igpu", 3: "accel", 4: "meta"}


@dataclass(frozen=True)
class Device:
    """One ggml device as llama.cpp sees it."""

    name: str  # "CPU", "CUDA0", "RPC0", ...
    description: str  # for RPC devices: the endpoint
    kind: str  # cpu, gpu, igpu, accel
    free: int
    total: int
    handle: int  # ggml_backend_dev_t, valid for the life of this process

    def to_dict(self) -> dict[str, object]:
        return {
            "name": self.name,
            "description": self.description,
            "kind": self.kind,
            "free": self.free,
            "total": self.total,
        }


class Ggml:
    """The ggml library that `libllama` (at `llama_lib`) links, with the calls homespec makes."""

    def __init__(self, llama_lib: Path) -> None:
        path = llama_lib.with_name(llama_lib.name.replace("libllama", "libggml", 1))
        try:
            lib = ctypes.CDLL(str(path))
        except OSError as exc:
            raise EngineError(
                f"cannot open {path}: {exc}", "reinstall: ./scripts/install.sh"
            ) from exc
        vp, cp, sz = ctypes.c_void_p, ctypes.c_char_p, ctypes.c_size_t
        for fn, args, res in (
            ("ggml_backend_reg_by_name", [cp], vp),
            ("ggml_backend_reg_get_proc_address", [vp, cp], vp),
            ("ggml_backend_register", [vp], None),
            ("ggml_backend_reg_dev_count", [vp], sz),
            ("ggml_backend_reg_dev_get", [vp, sz], vp),
            ("ggml_backend_dev_count", [], sz),
            ("ggml_backend_dev_get", [sz], vp),
            ("ggml_backend_dev_name", [vp], cp),
            ("ggml_backend_dev_description", [vp], cp),
            ("ggml_backend_dev_type", [vp], ctypes.c_int),
            ("ggml_backend_dev_memory", [vp, ctypes.POINTER(sz), ctypes.POINTER(sz)], None),
        ):
            f = getattr(lib, fn)
            f.argtypes, f.restype = args, res
        self._lib = lib
        self._workers: dict[str, tuple[Device, ...]] = {}

    def device(self, handle: int) -> Device:
        lib = self._lib
        free, total = ctypes.c_size_t(0), ctypes.c_size_t(0)
        lib.ggml_backend_dev_memory(handle, ctypes.byref(free), ctypes.byref(total))
        return Device(
            name=(lib.ggml_backend_dev_name(handle) or b"?").decode(),
            description=(lib.ggml_backend_dev_description(handle) or b"").decode(),
            kind=_DEV_TYPES.get(lib.ggml_backend_dev_type(handle), "?"),
            free=free.value,
            total=total.value,
            handle=handle,
        )

    def devices(self) -> list[Device]:
        """Every device registered in this process (local ones, and workers added so far)."""
        lib = self._lib
        return [
            self.device(lib.ggml_backend_dev_get(i)) for i in range(lib.ggml_backend_dev_count())
        ]

    def _rpc_proc(self, name: str, argtypes: list[Any], restype: Any) -> Any:
        reg = self._lib.ggml_backend_reg_by_name(b"RPC")
        if not reg:
            raise EngineError(
                "this llama.cpp build has no RPC backend",
                "reinstall with ./scripts/install.sh (it builds llama.cpp with -DGGML_RPC=on)",
            )
        addr = self._lib.ggml_backend_reg_get_proc_address(reg, name.encode())
        if not addr:
            raise EngineError(f"llama.cpp's RPC backend has no {name}", "reinstall homespec")
        return ctypes.CFUNCTYPE(restype, *argtypes)(addr)

    def add_worker(self, endpoint: str) -> tuple[Device, ...]:
        """Register a worker's devices in this process (idempotent) and return them.
        Aborts the process when the endpoint does not answer: probe it first."""
        if endpoint not in self._workers:
            add = self._rpc_proc("ggml_backend_rpc_add_server", [ctypes.c_char_p], ctypes.c_void_p)
            reg = add(endpoint.encode())
            if not reg:
                raise EngineError(
                    f"RPC worker {endpoint} reports no devices", "check `homespec worker`"
                )
            self._lib.ggml_backend_register(reg)
            n = self._lib.ggml_backend_reg_dev_count(reg)
            self._workers[endpoint] = tuple(
                self.device(self._lib.ggml_backend_reg_dev_get(reg, i)) for i in range(n)
            )
        return self._workers[endpoint]

    def serve(
        self, endpoint: str, devices: list[Device], *, threads: int, cache: Path | None
    ) -> None:
        """Run llama.cpp's RPC server on `endpoint` for `devices` until the process is killed
        (what llama.cpp's `rpc-server` tool does, from this same library)."""
        start = self._rpc_proc(
            "ggml_backend_rpc_start_server",
            [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_size_t, ctypes.c_size_t, ctypes.c_void_p],
            None,
        )
        handles = (ctypes.c_void_p * len(devices))(*(d.handle for d in devices))
        # The C loop never returns to Python: let Ctrl-C and SIGTERM end the process directly.
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        start(
            endpoint.encode(),
            str(cache).encode() if cache else None,
            threads,
            len(devices),
            ctypes.cast(handles, ctypes.c_void_p),
        )
        raise EngineError(
            f"llama.cpp's RPC server on {endpoint} stopped",
            "is the port already in use? see the messages above",
        )
