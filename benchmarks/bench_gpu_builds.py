"""Question: do infopt's GPU builds (``--target h100`` at fp16, bf16, fp8, int8 and int4 through Inductor) beat
eager fp16 PyTorch on the same GPU, and what do CUDA graphs add? fp8 and int8 are the stock-PyTorch route for a GPU
without TensorRT (``fp8-inductor``: ``torch._scaled_mm``; ``int8-inductor``: ``torch._int_mm`` W8A8 dynamic).

The models: the example DigitsCNN (trained on scikit-learn's digits) and TinyEncoder (trained on its
token task), an LLM-shaped MLP (8 Linear layers of 4096 x 4096 with ReLU, random weights) and
(``--models llama``) transformers' LlamaForCausalLM with a small random config (4 layers, hidden 1024,
grouped KV heads), logits over 32 tokens.
Each is built with ``infopt.build(model, target=TARGET, precision=P, backend="inductor")`` for P in
``--precisions`` (default fp16, bf16, fp8, int8, int4; the build validates drift against eager fp32 and times on the GPU with CUDA
events), then loaded with ``infopt.load(dist, cuda_graphs=False)`` and ``cuda_graphs=True`` and timed
in one run against eager fp16 (the fp32 model cast to fp16 on the GPU, inputs and outputs in fp32
as the builds take them), each runner in its own warm-up and timed block, CUDA events around each
call (host-to-device and device-to-host copies included, as a server sees them).

    python benchmarks/bench_gpu_builds.py [--target h100] [--markdown benchmarks/results/gpu_builds.md]
    python benchmarks/bench_gpu_builds.py --quick --models mlp       # a fast check; writes no results file
    python benchmarks/bench_gpu_builds.py --models mlp,llama --precisions fp16,bf16,fp8,int8   # the 8-bit table
"""

from __future__ import annotations

import sys
import tempfile
import time
import traceback
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.common import arguments, environment, publish  # noqa: E402

PRECISIONS = ("fp16", "bf16", "fp8", "int8", "int4")


def models(chosen: list[str]) -> dict:
    """name -> (module, input spec, dims, feeds by batch size)."""
    from examples.train import train_digits, train_encoder

    found = {}
    if "cnn" in chosen:
        model, data = train_digits()
        x = data["val"][0]
        found["DigitsCNN"] = (model, ["x:float32[batch,1,8,8]"], [], {b: {"x": x[:b]} for b in (1, 32)})
    if "encoder" in chosen:
        model, data = train_encoder()
        ids = data["val"][0]
        found["TinyEncoder (seq 16)"] = (model, ["input_ids:int64[batch,16]"], [], {b: {"input_ids": ids[:b]} for b in (1, 32)})
    if "mlp" in chosen:
        torch.manual_seed(0)
        layers = [m for _ in range(8) for m in (torch.nn.Linear(4096, 4096), torch.nn.ReLU())]
        model = torch.nn.Sequential(*layers).eval()
        x = np.random.default_rng(0).standard_normal((16, 4096)).astype(np.float32)
        found["LLM-shaped MLP (8 x 4096^2)"] = (model, ["x:float32[batch,4096]"], ["batch=1:1:16"],
                                                {b: {"x": x[:b]} for b in (1, 16)})
    if "llama" in chosen:
        import transformers

        torch.manual_seed(0)
        config = transformers.LlamaConfig(vocab_size=32000, hidden_size=1024, intermediate_size=2816, num_hidden_layers=4,
                                          num_attention_heads=16, num_key_value_heads=4, max_position_embeddings=256)
        model = transformers.LlamaForCausalLM(config).eval()
        ids = np.random.default_rng(0).integers(0, config.vocab_size, (8, 32)).astype(np.int64)
        found["Llama-shaped LM (4 x 1024, random)"] = (model, ["input_ids:int64[batch,32]"], ["batch=1:1:8"],
                                                      {b: {"input_ids": ids[:b]} for b in (1, 8)})
    return found


def eager_fp16(model):
    """The fp32 model computing in fp16 on the GPU, fp32 in and out (as the builds take their inputs)."""
    from infopt.passes.fx.cast_precision import cast_module

    return cast_module(model, torch.float16).cuda()


def build_rows(args, name, entry, workdir: Path, notes: list[str]) -> list[str]:
    import infopt
    from infopt.runtime.runner import TorchRunner
    from infopt.validators.timing import measure

    model, inputs, dims, feeds = entry
    names = [spec.split(":")[0] for spec in inputs]
    runners = {"eager fp16": TorchRunner(eager_fp16(model), names, device="cuda").run}
    drift = {}
    for precision in args.precisions.split(","):
        out = workdir / f"{name.split()[0]}-{precision}"
        try:
            result = infopt.build(model, target=args.target, precision=precision, backend="inductor", inputs=inputs,
                                  dims=dims or None, output=out, force=True, progress=False)
        except Exception as exc:  # noqa: BLE001 - one build failing must not lose the run
            notes.append(f"{name} {precision}: build failed: {type(exc).__name__}: {str(exc).splitlines()[0][:200]}")
            continue
        verdict = result.manifest.validation.verdict.model_dump()
        worst = result.manifest.validation.drift.get("worst", {})
        drift[precision] = (verdict["passed"], worst.get("cosine_min"), worst.get("max_abs"))
        for graphs in (False, True):
            try:
                runner = infopt.load(out, allow_failed=True, cuda_graphs=graphs)
            except Exception as exc:  # noqa: BLE001
                notes.append(f"{name} {precision}: load failed: {type(exc).__name__}: {str(exc)[:200]}")
                continue
            runners[f"infopt {precision}{', CUDA graphs' if graphs else ''}"] = runner.run
    stats = measure(runners, feeds, warmup=args.warmup, iterations=args.iterations,
                    devices={k: "cuda" for k in runners}).stats
    eager = {s.batch: s.p50_ms for s in stats if s.runner == "eager fp16"}
    rows = []
    for s in stats:
        precision = s.runner.split()[1].rstrip(",") if s.runner.startswith("infopt") else None
        passed, cos, max_abs = drift.get(precision, (None, None, None))
        check = "-" if precision is None else f"{'PASS' if passed else 'FAIL'}, cos min {cos:.4f}" if cos is not None else "-"
        rows.append(f"| {name} | {s.batch} | {s.runner} | {s.p50_ms:.3f} | {s.p90_ms:.3f} | {s.p99_ms:.3f} | "
                    f"{s.batch / (s.p50_ms / 1e3):.0f} | {eager[s.batch] / s.p50_ms:.2f}x | {check} |")
    return rows


def main() -> None:
    args = arguments(__doc__, "gpu_builds.md", "cnn,encoder,mlp,llama", "a fast check: 20 iterations; writes no results file",
                     extra=lambda parser: (parser.add_argument("--target", default="h100", help="a CUDA target"),
                                           parser.add_argument("--precisions", default=",".join(PRECISIONS),
                                                               help="comma list of the precisions built")))
    if not torch.cuda.is_available():
        print("bench_gpu_builds needs a CUDA GPU and torch sees none (torch.cuda.is_available() is False)")
        sys.exit(4)
    started = time.perf_counter()
    notes: list[str] = []
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        workdir = args.workdir or Path(tmp)
        for name, entry in models([m.strip() for m in args.models.split(",")]).items():
            try:
                rows += build_rows(args, name, entry, workdir, notes)
            except Exception:  # noqa: BLE001
                notes.append(f"{name}: failed: {traceback.format_exc()[-1500:]}")
    props = torch.cuda.get_device_properties(0)
    table = ["| model | batch | runner | p50 ms | p90 ms | p99 ms | samples/s (p50) | vs eager fp16 (p50) | build verdict |",
             "| --- " * 9 + "|"] + rows
    lines = environment() + [
        f"GPU: {props.name}, {props.multi_processor_count} SMs; CUDA {torch.version.cuda}; target {args.target}; "
        f"run on {time.strftime('%Y-%m-%d')}",
        f"{args.iterations} timed runs per row after {args.warmup} warm-up runs; whole run "
        f"{time.perf_counter() - started:.0f} s",
    ] + notes
    publish("\n".join(table) + "\n\n" + "\n".join(f"- {line}" for line in lines), args.markdown)


if __name__ == "__main__":
    main()
