"""Derive an adapter with more dense layers from a trained one, without retraining.

`sparsify` trains every MSA layer on its own: the hidden inputs come from the frozen dense model,
each layer's projections start from its own attention weights and its random draws come from a
generator seeded with `seed * 100003 + layer`. So the adapter that `sparsify ... --dense-layers
D + X` would make holds exactly the layers of the `--dense-layers D` adapter minus X
(`tests/engine/test_sparsify.py` checks this bitwise on the CPU). `keep_dense` writes that adapter:
the remaining tensors byte for byte, the `msa` config with the new dense layers, and a provenance
whose `command` and `settings` are those of the equivalent `sparsify` run, plus a `derived` record
of how the folder was actually made.
"""
from __future__ import annotations

import hashlib
import json
import shlex
from pathlib import Path
from typing import Any

from engine.msa.adapter import CONFIG_FILE, PROVENANCE_FILE, TENSORS_FILE, AdapterError, write_json
from msa_common.atomic import atomic_write_bytes


def _with_dense_layers(command: str, dense: list[int]) -> str:
    """The `sparsify` command line with its `--dense-layers` replaced (or added) and `--out` kept."""
    argv = shlex.split(command)
    value = ",".join(str(i) for i in dense)
    if "--dense-layers" in argv:
        argv[argv.index("--dense-layers") + 1] = value
    else:
        argv += ["--dense-layers", value]
    return " ".join(shlex.quote(a) for a in argv)


def keep_dense(src: str | Path, extra_dense: list[int], out: str | Path) -> dict[str, Any]:
    """Copy the adapter `src` to `out` with the layers `extra_dense` made dense (their index
    projections dropped). Returns the new provenance. Raises `AdapterError` for a layer that is
    not an MSA layer of `src` or a folder that is not an adapter."""
    from safetensors.torch import load as st_load
    from safetensors.torch import save as st_save

    src, out = Path(src), Path(out)
    try:
        meta = json.loads((src / CONFIG_FILE).read_text())
        prov = json.loads((src / PROVENANCE_FILE).read_text())
        blob = (src / TENSORS_FILE).read_bytes()
    except (OSError, ValueError) as e:
        raise AdapterError(f"{src} is not a complete MSA adapter ({e}): give a folder written by `sparsify`") from None
    old_dense = list(meta["msa"]["dense_layers"])
    tensors = st_load(blob)
    msa_layers = sorted({int(k.split(".")[1]) for k in tensors})
    bad = sorted(set(extra_dense) - set(msa_layers))
    if bad:
        raise AdapterError(f"layers {bad} are not MSA layers of {src} (those are {msa_layers}): drop only those")
    dense = sorted(set(old_dense) | set(extra_dense))
    kept = {k: v for k, v in tensors.items() if int(k.split(".")[1]) not in dense}
    new_blob = st_save(kept, metadata={"format": str(meta.get("format", 1))})
    msa = dict(meta["msa"], dense_layers=dense)
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_bytes(out / TENSORS_FILE, new_blob)
    write_json(out / CONFIG_FILE, dict(meta, msa=msa, tensors_sha256=hashlib.sha256(new_blob).hexdigest()))
    layers = {k: v for k, v in prov.get("layers", {}).items() if int(k) not in dense}
    mean = lambda key: sum(v[key] for v in layers.values()) / max(len(layers), 1)  # noqa: E731 - a one-line local helper
    new = dict(prov, msa=msa, layers=layers, settings=dict(prov.get("settings", {}), dense_layers=dense),
               command=_with_dense_layers(prov.get("command", ""), dense),
               mean_recall_before=mean("recall_before"), mean_recall_after=mean("recall_after"))
    new["derived"] = {"from_command": prov.get("command"), "from_tensors_sha256": meta.get("tensors_sha256"),
                      "dropped_layers": sorted(set(dense) - set(old_dense)),
                      "how": "engine.sparsify.subset.keep_dense: the source's tensors minus the dropped layers, "
                             "byte for byte (what `command` trains, layer by layer)"}
    write_json(out / PROVENANCE_FILE, new)
    return new
