"""transformers' own architectures, as a user brings them: a folder written by ``save_pretrained``
(config.json and safetensors, tiny random configs), built from the command line in the folder that
holds it, with a relative path.

This is the first slice of the zoo: the families whose default ONNX Runtime build failed before
(Llama, Qwen2 and Mistral on ONNX Runtime's RMSNorm op that onnx's checker does not know, GPT-2 on a
fusion ONNX Runtime refused, ELECTRA's token-classification head on an output name, BERT-family
``--int8`` on bias initializers the exporter shares), INT4 of Llama and GPT-2, image and audio models
built from the input they read (ViT, ResNet, wav2vec2), and an encoder-decoder refused with what to do. Each
cell asserts exit 0, every candidate built, no traceback, and the drift the manifest measured.
``--backend onnxruntime`` keeps each build to seconds (the AOTInductor candidate's C++ compile is
what the default adds; the CPU matrix covers it).

The builds run the CLI's own entry point (``infopt.cli.app.main``: the same argument parsing, loading,
build and exit codes) in the test's process, as the CPU matrix does, so that each cell does not pay
the interpreter's start-up and the imports of torch and transformers again (about 5 s a cell); the
refusals below, and the text-generation, hub and documented-command tests, run ``python -m infopt.cli`` in a
process of its own."""

from __future__ import annotations

import json

import pytest

from infopt.api.build_config import DEFAULT_MAX_VAL_SAMPLES
from tests.support.cli import ROOT, assert_clean_failure, run_cli, run_cli_here

transformers = pytest.importorskip("transformers")

from tests.support.zoo import ENCODER, FAMILIES, TOKEN_TYPES  # noqa: E402

PRECISIONS = ("fp32", "int8", "bf16", "int4")
NO_LINEAR = {"resnet"}
"""families with no Linear layer for weight-only INT4 to quantize"""
BUILT = [f for f in FAMILIES if f != "bart"]
CELLS = [(f, p, "auto" if p == "bf16" else "onnxruntime") for p in PRECISIONS for f in BUILT
         if not (p == "int4" and f in NO_LINEAR)] + [(f, "fp32", "auto") for f in BUILT]
"""every family at every precision that applies, with ONNX Runtime (fp32, INT8, INT4; a build in seconds) and
with the default backend (fp32 and bf16: every candidate, AOTInductor's C++ compile included): ``make zoo``
builds them all"""
EVERY_RUN = {("llama", "fp32"), ("qwen2", "fp32"), ("mistral", "fp32"), ("gpt2", "fp32"), ("electra-tokens", "fp32"),
             ("vit", "fp32"), ("resnet", "fp32"), ("wav2vec2", "fp32"), ("bert", "int8"), ("distilbert", "int8"),
             ("qwen2", "int8"), ("vit", "int8"), ("gptneox", "fp32"), ("opt", "fp32"), ("gemma", "fp32"),
             ("qwen3", "fp32"), ("phi3", "fp32"), ("roberta", "fp32"), ("xlmr-classifier", "int8"), ("debertav2", "fp32"),
             ("modernbert-mlm", "fp32"), ("t5-encoder", "fp32"), ("convnext", "fp32"), ("swin", "fp32"),
             ("clip-vision", "fp32"), ("whisper-encoder", "fp32"), ("bert-qa", "fp32"), ("llama", "bf16"), ("vit", "bf16"),
             ("electra-tokens", "int4"), ("clip-image-embeds", "fp32"), ("llama", "fp32", "auto"),
             ("mixtral", "int8")}
"""the slice ``make test`` builds (a cell of each task, the families that failed before, bf16 of a decoder and
an image model, INT4 of a classifier whose head the checkpoint cannot pack); the INT4 tests below add Llama,
GPT-2 and the SmolLM widths"""
INPUT = {"vit": ("pixel_values", ["batch", 3, 32, 32], "logits"), "resnet": ("pixel_values", ["batch", 3, 224, 224], "pooler_output"),
         "wav2vec2": ("input_values", ["batch", "samples"], "logits"), "convnext": ("pixel_values", ["batch", 3, 32, 32], "logits"),
         "swin": ("pixel_values", ["batch", 3, 32, 32], "last_hidden_state"),
         "clip-vision": ("pixel_values", ["batch", 3, 32, 32], "last_hidden_state"),
         "clip-image-embeds": ("pixel_values", ["batch", 3, 32, 32], "image_embeds"),
         "whisper-encoder": ("input_features", ["batch", 16, 64], "logits")}
"""what the image and audio models read (from the config) and answer"""
TASKS = {"image": ("vit", "resnet", "convnext", "swin", "clip-vision", "clip-image-embeds"), "audio": ("wav2vec2", "whisper-encoder"),
         "feature-extraction": ("bert", "roberta", "debertav2", "t5-encoder", "distilbert"),
         "classification": ("electra-tokens", "xlmr-classifier", "modernbert-mlm"), "question-answering": ("bert-qa",)}
"""the task each family is built as (causal-lm for the rest)"""
@pytest.fixture(scope="module")
def zoo(tmp_path_factory):
    import torch

    folder = tmp_path_factory.mktemp("zoo")
    for name, make in FAMILIES.items():
        torch.manual_seed(0)
        make().eval().save_pretrained(folder / f"tiny-{name}")
    return folder


def in_every_run(family: str, precision: str, backend: str) -> bool:
    """``(family, precision)`` in :data:`EVERY_RUN` names the cell with the precision's first backend;
    ``(family, precision, backend)`` names one backend."""
    first = "auto" if precision == "bf16" else "onnxruntime"
    return (family, precision, backend) in EVERY_RUN or (backend == first and (family, precision) in EVERY_RUN)


@pytest.mark.slow
@pytest.mark.parametrize(("family", "precision", "backend"), [
    pytest.param(f, p, b, id=f"{f}-{p}" + ("-auto" if b == "auto" and p != "bf16" else ""),
                 marks=() if in_every_run(f, p, b) else pytest.mark.zoo) for f, p, b in CELLS])
def test_a_transformers_folder_builds_from_the_command_line(zoo, family, precision, backend):
    """Each cell with ``--strict``: every candidate of the backend builds and passes."""
    out = f"dist-{family}-{precision}-{backend}"
    media = {"wav2vec2": ["--dim", "samples=4000:8000:16000"]}
    dims = media.get(family, [] if family in INPUT else ["--dim", "seq=1:16:32"])
    backend = [] if backend == "auto" else ["--backend", backend]
    proc = run_cli_here("build", f"tiny-{family}", f"--{precision}", *backend, "--dim", "batch=1:2:4",
                        *dims, "--batch-sizes", "1,4", "-o", out, "--json", "-q", "--strict", cwd=zoo)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr
    manifest = json.loads((zoo / out / "manifest.json").read_text())
    statuses = {c["recipe"]: c["status"] for c in manifest["candidates"]}
    assert "failed" not in statuses.values(), statuses
    task = next((name for name, families in TASKS.items() if family in families), "causal-lm")
    assert manifest["source"]["task"]["name"] == task
    if family == "bert-qa":
        assert [o["name"] for o in manifest["outputs"]] == ["start_logits", "end_logits"]
    if family in INPUT:
        name, shape, output = INPUT[family]
        assert [(i["name"], i["shape"]) for i in manifest["inputs"]["inputs"]] == [(name, shape)]
        assert [o["name"] for o in manifest["outputs"]] == [output]
    else:
        names = [i["name"] for i in manifest["inputs"]["inputs"]]
        assert names == ["input_ids", "attention_mask"] + (["token_type_ids"] if family in TOKEN_TYPES else [])
    if family in TOKEN_TYPES and precision == "fp32":
        assert_segments_read_as_transformers_reads_them(zoo, family, zoo / out)
    worst = manifest["validation"]["drift"]["worst"]
    assert manifest["validation"]["verdict"]["passed"]
    assert worst["cosine_min"] >= {"fp32": 0.9999, "bf16": 0.99}.get(precision, 0.95), worst


def assert_segments_read_as_transformers_reads_them(zoo, family, dist):
    """A sentence pair (segment B of type 1) gives what transformers gives for it, and not what it gives for
    one segment: the deployable reads token types, it does not fix them at 0."""
    import numpy as np
    import torch

    import infopt

    folder = zoo / f"tiny-{family}"
    architecture = json.loads((folder / "config.json").read_text())["architectures"][0]
    source = getattr(transformers, architecture).from_pretrained(folder)
    ids = np.random.default_rng(0).integers(3, 512, (2, 16))
    mask, types = np.ones_like(ids), np.zeros_like(ids)
    types[:, 8:] = 1
    got = infopt.load(dist)(ids, mask, types)
    got = got[0] if isinstance(got, tuple) else got
    with torch.no_grad():
        pair, single = (source.eval()(input_ids=torch.tensor(ids), attention_mask=torch.tensor(mask),
                                      token_type_ids=torch.tensor(t))[0].numpy() for t in (types, np.zeros_like(ids)))
    assert np.abs(got - pair).max() < 1e-4 < np.abs(got - single).max()


def build_int4(zoo, family):
    out = f"dist-{family}-int4"
    proc = run_cli_here("build", f"tiny-{family}", "--int4", "--backend", "onnxruntime", "--dim", "batch=1:2:4",
                        "--dim", "seq=1:16:32", "--batch-sizes", "1,4", "-o", out, "--json", "-q", "--strict", cwd=zoo)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr
    manifest = json.loads((zoo / out / "manifest.json").read_text())
    assert manifest["validation"]["verdict"]["passed"] and manifest["precision"] == "int4"
    return zoo / out, next(p for p in manifest["passes"] if p["name"] == "quantize_int4")


@pytest.mark.slow
def test_int4_of_a_model_no_layer_of_which_128_divides_takes_one_group_size_its_checkpoint_holds(zoo):
    """Llama at hidden 64 (as SmolLM-135M at 576): 128 divides no layer; the whole model takes 64, and
    transformers (through gptqmodel) loads the GPTQ checkpoint and computes what the model does."""
    import torch

    out, quantized = build_int4(zoo, "llama")
    assert {row["group_size"] for row in quantized["details"]["layers"]} == {64}
    assert len(quantized["details"]["layers"]) == 14 and quantized["details"]["checkpoint"]["format"] == "gptq"
    loaded, info = transformers.AutoModelForCausalLM.from_pretrained(
        out / "servers" / "vllm", dtype=torch.float32, device_map="cpu", output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"]
    source = transformers.AutoModelForCausalLM.from_pretrained(zoo / "tiny-llama").eval()
    ids = torch.randint(0, 512, (2, 12), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        got, want = loaded(ids).logits.float(), source(ids).logits
    assert torch.nn.functional.cosine_similarity(got.flatten(1), want.flatten(1)).min() >= 0.98


@pytest.mark.slow
def test_int4_of_gpt2_quantizes_its_conv1d_layers(zoo):
    """GPT-2's projections are transformers' Conv1D (a Linear with its weight transposed): all eight go
    to INT4; no checkpoint, since transformers cannot load a GPTQ GPT-2, and the note says so."""
    out, quantized = build_int4(zoo, "gpt2")
    names = {row["name"] for row in quantized["details"]["layers"]}
    assert len(names) == 8 and any(name.endswith("attn.c_attn") for name in names)
    assert any("Conv1D layers quantized" in note for note in quantized["notes"])
    assert any(note.startswith("no 4-bit checkpoint: transformers") for note in quantized["notes"])
    assert not (out / "servers" / "vllm").exists()


def test_an_encoder_decoder_folder_is_refused_with_what_to_build(zoo):
    proc = run_cli("build", "tiny-bart", "-q", cwd=zoo)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "encoder-decoder model (BartModel)" in proc.stderr and "get_encoder()" in proc.stderr
    assert not (zoo / "dist").exists()


@pytest.mark.slow
def test_int4_of_smollm_widths_takes_group_size_64(zoo):
    """SmolLM-135M's layers are 576 and 1536 wide: 128 divides neither 576 nor the checkpoint's one size."""
    _, quantized = build_int4(zoo, "smollm")
    assert {row["group_size"] for row in quantized["details"]["layers"]} == {64}
    assert quantized["details"]["checkpoint"]["format"] == "gptq"


@pytest.fixture(scope="module")
def media(zoo):
    """ViT and wav2vec2 folders with the image processor and feature extractor saved beside the model,
    as the hub has them, a BERT folder with a tokenizer, and raw files: 12 PNG images of several sizes, 6 mono 16 kHz PCM .wav files."""
    import shutil
    import wave

    import numpy as np
    from PIL import Image

    for name, processor in (("vit", transformers.ViTImageProcessor(size={"height": 32, "width": 32})),
                            ("wav2vec2", transformers.Wav2Vec2FeatureExtractor(sampling_rate=16000))):
        shutil.copytree(zoo / f"tiny-{name}", zoo / f"{name}-with-processor")
        processor.save_pretrained(zoo / f"{name}-with-processor")
    shutil.copytree(zoo / "tiny-bert", zoo / "bert-with-tokenizer")
    words = sorted({w for line in (ROOT / "tests" / "data" / "sentences.txt").read_text().lower().split("\n")
                    for w in line.replace(".", " ").replace(",", " ").split()})[:400]
    vocab = zoo / "vocab.txt"
    vocab.write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *words]) + "\n")
    transformers.BertTokenizer(vocab=str(vocab)).save_pretrained(zoo / "bert-with-tokenizer")
    shutil.copy(ROOT / "tests" / "data" / "sentences.txt", zoo / "sentences.txt")
    rng = np.random.default_rng(0)
    (zoo / "images").mkdir()
    for i in range(12):
        Image.fromarray(rng.integers(0, 255, (40 + 4 * i, 48, 3), dtype=np.uint8)).save(zoo / "images" / f"{i}.png")
    for folder, rate in (("audio", 16000), ("audio-8k", 8000)):
        (zoo / folder).mkdir()
        for i in range(6):
            t = np.arange(4000 + 1500 * i) / rate
            wav = (0.3 * np.sin(2 * np.pi * (220 + 40 * i) * t) * 32767).astype(np.int16)
            with wave.open(str(zoo / folder / f"{i}.wav"), "wb") as f:
                f.setnchannels(1), f.setsampwidth(2), f.setframerate(rate), f.writeframes(wav.tobytes())
    return zoo


@pytest.mark.slow
def test_an_image_model_calibrates_and_validates_on_a_folder_of_images(media):
    """--calib and --val take image files: through the folder's image processor, every image (of
    several sizes) becomes the 32x32 pixel_values the model reads; INT8 is judged on them."""
    proc = run_cli_here("build", "vit-with-processor", "--int8", "--require-precision", "--calib", "images", "--val",
                        "images", "--backend", "onnxruntime", "--dim", "batch=1:2:4", "--batch-sizes", "1,4", "-o",
                        "vit-images", "--json", "-q", cwd=media)
    assert proc.returncode == 0, proc.stderr[-3000:]
    manifest = json.loads((media / "vit-images" / "manifest.json").read_text())
    assert manifest["provenance"]["calibration"]["source"] == "images"
    assert manifest["provenance"]["calibration"]["samples"] == 12
    assert manifest["validation"]["drift"]["source"] == "images" and manifest["validation"]["drift"]["samples"] == 12
    assert manifest["precision"] == "int8" and manifest["validation"]["drift"]["worst"]["cosine_min"] >= 0.95


@pytest.mark.slow
def test_a_text_model_validates_on_a_text_file_through_its_tokenizer(media):
    lines = [line for line in (media / "sentences.txt").read_text().splitlines() if line.strip()]
    proc = run_cli_here("build", "bert-with-tokenizer", "--val", "sentences.txt", "--backend", "onnxruntime", "--dim",
                        "batch=1:2:4", "--dim", "seq=1:16:32", "--batch-sizes", "1", "-o", "bert-text", "--json", "-q",
                        cwd=media)
    assert proc.returncode == 0, proc.stderr[-3000:]
    drift = json.loads((media / "bert-text" / "manifest.json").read_text())["validation"]["drift"]
    assert drift["source"] == "sentences.txt" and not drift["random_inputs"]
    assert drift["samples"] == min(len(lines), DEFAULT_MAX_VAL_SAMPLES)


@pytest.mark.slow
def test_an_audio_model_validates_on_wav_files(media):
    proc = run_cli_here("build", "wav2vec2-with-processor", "--val", "audio", "--backend", "onnxruntime", "--dim",
                        "batch=1:2:4", "--dim", "samples=4000:8000:16000", "--batch-sizes", "1", "-o", "w2v-audio",
                        "--json", "-q", cwd=media)
    assert proc.returncode == 0, proc.stderr[-3000:]
    drift = json.loads((media / "w2v-audio" / "manifest.json").read_text())["validation"]["drift"]
    assert drift["source"] == "audio" and drift["samples"] == 6 and not drift["random_inputs"]
    assert drift["worst"]["cosine_min"] >= 0.9999


@pytest.mark.parametrize(("folder", "data", "message"), [
    ("tiny-vit", "images", "has no image processor (preprocessor_config.json)"),
    ("wav2vec2-with-processor", "audio-8k", "sampled at 8000 Hz; the model's feature extractor takes 16000 Hz"),
    ("bert-with-tokenizer", "images", "holds neither .npy/.npz/.pt samples nor the raw files this feature-extraction model reads (.txt)"),
])
def test_raw_files_the_model_cannot_read_are_exit_2_saying_what_to_do(media, folder, data, message):
    proc = run_cli("build", folder, "--val", data, "--backend", "onnxruntime", "-o", f"refused-{data}", "-q", cwd=media)
    assert_clean_failure(proc, 2, message, out=media / f"refused-{data}")


def test_a_guard_torch_cannot_prove_over_the_range_is_checked_at_run_time(zoo):
    """wav2vec2's feature encoder in bf16: torch.export adds a guard on ``samples`` that holds over the
    whole range but that its range analysis cannot prove; capture is retried with the guard deferred,
    and the program runs at both ends of the range as eager does."""
    import torch

    from infopt.core.inputspec import DimRange, InputSpec
    from infopt.exporters.torch_export import export_module
    from infopt.passes.fx.cast_precision import cast_module
    from infopt.runtime.hf_folder import load_hf_folder

    source = load_hf_folder(zoo / "tiny-wav2vec2")
    spec = InputSpec.parse(["input_values:float32[batch,samples]"]).with_dims(
        {"batch": DimRange(1, 2, 4), "samples": DimRange(4000, 8000, 16000)})
    program = export_module(cast_module(export_module(source.module, spec).module(), torch.bfloat16), spec)
    for samples in (4000, 16000):
        x = torch.randn(2, samples, generator=torch.Generator().manual_seed(samples))
        with torch.no_grad():
            got, want = program.module()(x), source.module(x)
        assert got.shape == want.shape and got.dtype == torch.float32
        assert torch.nn.functional.cosine_similarity(got.flatten(1), want.flatten(1)).min() >= 0.99


def test_bf16_recapture_of_a_model_that_makes_a_float32_tensor_by_name(zoo):
    """DeBERTa-v2 computes its attention scale with ``torch.tensor(..., dtype=torch.float)``: the cast to
    bf16 must not keep the first capture's float32 metadata checks, and the bf16 program computes what
    the model does."""
    import torch

    from infopt.core.inputspec import DimRange
    from infopt.exporters.torch_export import export_module
    from infopt.passes.fx.cast_precision import cast_module
    from infopt.runtime.hf_folder import load_hf_folder

    source = load_hf_folder(zoo / "tiny-debertav2")
    spec = source.spec.with_dims({"batch": DimRange(1, 2, 4), "seq": DimRange(1, 16, 32)})
    program = export_module(cast_module(export_module(source.module, spec).module(), torch.bfloat16), spec)
    ids = torch.randint(0, 512, (2, 16), generator=torch.Generator().manual_seed(0))
    mask = torch.ones_like(ids)
    with torch.no_grad():
        got, want = program.module()(ids, mask), source.module(ids, mask)
    assert got.dtype == torch.float32
    assert torch.nn.functional.cosine_similarity(got.flatten(1), want.flatten(1)).min() >= 0.99


@pytest.mark.parametrize(("family", "longest"), [("roberta", 64), ("xlmr-classifier", 64), ("bert", 64)])
def test_the_default_sequence_range_is_what_the_position_table_holds(zoo, family, longest):
    """RoBERTa-style models number positions after the padding id: 66 positions hold 64 tokens; the
    default range ends there, and the model runs at its end on ids that are not padding."""
    import torch

    from infopt.runtime.hf_folder import load_hf_folder

    source = load_hf_folder(zoo / f"tiny-{family}")
    assert source.spec.dims["seq"].max == longest
    ids = torch.randint(2, 512, (1, longest), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert torch.isfinite(source.module(ids, torch.ones_like(ids))).all()


def test_random_ids_span_the_word_embedding_table_not_the_smallest_table(zoo):
    """BERT's smallest table is its 2 token types: random input_ids capped by it would be 0 and 1 only,
    and drift would be measured on two tokens."""
    from infopt.core.sample_inputs import id_high, random_feed
    from infopt.runtime.hf_folder import load_hf_folder

    source = load_hf_folder(zoo / "tiny-bert")
    assert id_high(source.module) == {"input_ids": 512, "token_type_ids": 2}
    feed = random_feed(source.spec, int_high=id_high(source.module), batch=4, seq=32)
    assert feed["input_ids"].max() > 100 and len(set(feed["input_ids"].ravel().tolist())) > 50
    assert set(feed["token_type_ids"].ravel().tolist()) == {0, 1}  # both segments, nothing past the table


def test_token_types_are_an_input_only_where_they_can_change_the_output(tmp_path):
    """roberta-base's and xlm-roberta-base's token-type table has one row: every id is 0, so no input is
    asked for; a table of two rows (BERT's segments A and B) is read from ``token_type_ids``."""
    from infopt.runtime.hf_folder import load_hf_folder

    for rows, expected in ((1, ["input_ids", "attention_mask"]), (2, ["input_ids", "attention_mask", "token_type_ids"])):
        folder = tmp_path / f"roberta-{rows}"
        transformers.RobertaModel(transformers.RobertaConfig(vocab_size=512, max_position_embeddings=66, **ENCODER,
                                                             type_vocab_size=rows)).save_pretrained(folder)
        assert list(load_hf_folder(folder).spec.names) == expected
