"""``infopt build FOLDER --task text-generation``: transformers' own decoder families (tiny random configs
saved with ``save_pretrained``, each with a byte-level BPE tokenizer trained here on the test sentences),
built from the command line with a relative path, and the folder it writes taken by its real consumer:
``onnxruntime_genai.Model`` loads ``servers/onnxruntime-genai/`` in this test and generates from a held-out
sentence, token for token what transformers' ``generate`` gives."""

from __future__ import annotations

import json

import numpy as np
import pytest

from tests.support.cli import ROOT, assert_clean_failure, run_cli, run_cli_here
from tests.support.decoders import DECODERS, EVERY_RUN, LAYERS, SENTENCES, decoder
from tests.support.zoo import FAMILIES

og = pytest.importorskip("onnxruntime_genai")
transformers = pytest.importorskip("transformers")

NEW_TOKENS = 12
ROTARY_INSIDE = {"llama", "qwen2", "mistral", "phi3", "gemma", "qwen3"}
"""the families whose rotary embedding ``GroupQueryAttention`` computes (GPT-NeoX's tiny config rotates 4 dims, fewer
than the op's 16; GPT-2 and OPT learn their positions)"""


@pytest.fixture(scope="module")
def decoders(tmp_path_factory):
    folder = tmp_path_factory.mktemp("decoders")
    lines = [s for s in SENTENCES.read_text().splitlines() if s.strip()]
    (folder / "prompts.txt").write_text("\n".join(lines[400:404]) + "\n")
    (folder / "held-out.txt").write_text(lines[470] + "\n")
    return folder


@pytest.mark.slow
@pytest.mark.parametrize("family", [pytest.param(f, marks=() if f in EVERY_RUN else pytest.mark.zoo) for f in DECODERS])
def test_a_causal_lm_builds_a_genai_folder_that_generates_what_transformers_generates(decoders, family):
    decoder(decoders, family)
    proc = run_cli("build", f"tiny-{family}", "--task", "text-generation", "--val", "prompts.txt", "--json", "-q",
                   cwd=decoders, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr and "warning" not in proc.stderr.lower()
    dist = decoders / "dist" / f"tiny-{family}"
    manifest = json.loads((dist / "manifest.json").read_text())
    generation = manifest["validation"]["generation"]
    assert generation["greedy"] == {"prompts": 4, "new_tokens": 16, "equal": 4, "differences": []}
    assert [r["prompt_tokens"] for r in generation["ttft"]] == [32]  # the tiny configs hold 64 positions
    assert [r["batch"] for r in generation["tpot"]] == [1, 4, 8] and all(r["p50_ms"] > 0 for r in generation["tpot"])
    # every row ran at least once; a TPOT run gives a sample per token after the first
    assert all(1 <= r["runs"] == r["samples"] for r in generation["ttft"])
    assert all(r["samples"] == r["runs"] * 15 for r in generation["tpot"]) and generation["budget_s"] > 0
    assert "timed runs per row after the judging's runs (no warm-up)" in (dist / "report.md").read_text()
    assert manifest["source"]["task"] == {"name": "text-generation", "judged_by": "greedy tokens equal"}
    assert manifest["artifacts"]["onnxruntime-genai"] == "servers/onnxruntime-genai"
    # the task's recipe ran on the pipeline: the manifest lists the passes the recipe names, each with its details
    recipe = manifest["recipe"]
    assert recipe["name"] == "fp32-onnxruntime-genai" and recipe["task"] == "text-generation"
    assert [p["name"] for p in manifest["passes"]] == [s["name"] for s in recipe["passes"]] == [
        "capture_kv_decoder", "onnx_export", "fuse_decoder", "write_genai_folder"]
    capture = manifest["passes"][0]["details"]
    assert capture["layers"] == LAYERS and capture["fused"] is True and capture["rotary_inside"] == (family in ROTARY_INSIDE)
    # captured with two layers, the second stamped for the other two by the export, which says so
    assert capture["stamped"] is True and manifest["passes"][1]["details"]["stamped_layers"] == LAYERS - 2
    assert manifest["passes"][-1]["details"]["share_buffer"] is True
    assert "## Text generation" in (dist / "report.md").read_text()
    import onnx

    # attention as one GroupQueryAttention per layer, the norms fused
    graph = onnx.load(str(dist / "servers" / "onnxruntime-genai" / "model.onnx")).graph
    ops = [n.op_type for n in graph.node]
    assert ops.count("GroupQueryAttention") == LAYERS, sorted(set(ops))
    if family in ROTARY_INSIDE:  # the op rotates from its cos/sin tables: no rotate-half left in the graph
        assert all(len(n.input) == 9 and n.input[7] and n.input[8] for n in graph.node if n.op_type == "GroupQueryAttention")
        assert "Neg" not in ops
    if family == "llama":  # per layer one MatMul for query/key/value, one for gate/up, and o and down; and the head
        assert ops.count("MatMul") == LAYERS * 4 + 1
    # a head tied to the embedding reads the lookup's table as stored (FusedMatMul, transB): no transpose of a
    # weight left for ONNX Runtime to fold, a transposed copy, each time it opens the folder
    tables = {t.name for t in graph.initializer}
    heads = [n for n in graph.node if n.op_type == "FusedMatMul"]
    assert not any(n.op_type == "Transpose" and n.input[0] in tables for n in graph.node)
    if transformers.AutoConfig.from_pretrained(decoders / f"tiny-{family}").tie_word_embeddings:
        assert len(heads) == 1 and any(n.op_type == "Gather" and n.input[0] == heads[0].input[1] for n in graph.node)
        assert manifest["passes"][2]["details"]["rewrites"]["heads reading the embedding's table"] == 1
    else:
        assert not heads
    assert any(op in ops for op in ("SimplifiedLayerNormalization", "SkipSimplifiedLayerNormalization",
                                    "SkipLayerNormalization", "LayerNormalization"))

    # the consumer: ONNX Runtime GenAI loads the folder as written and generates from a sentence no build saw
    folder = dist / "servers" / "onnxruntime-genai"
    config = json.loads((folder / "genai_config.json").read_text())
    # every layer's attention is GroupQueryAttention: the cache is one buffer each step writes into
    assert config["search"]["past_present_share_buffer"] is True
    tokenizer = transformers.AutoTokenizer.from_pretrained(folder)
    prompt = tokenizer((decoders / "held-out.txt").read_text().strip())["input_ids"][:24]
    model = og.Model(str(folder))
    params = og.GeneratorParams(model)
    params.set_search_options(max_length=len(prompt) + NEW_TOKENS, min_length=len(prompt) + NEW_TOKENS)
    generator = og.Generator(model, params)
    generator.append_tokens(np.asarray([prompt], dtype=np.int32))
    while not generator.is_done():
        generator.generate_next_token()
    got = [int(t) for t in generator.get_sequence(0)]

    import torch

    lm = transformers.AutoModelForCausalLM.from_pretrained(decoders / f"tiny-{family}").eval()
    with torch.inference_mode():
        ids = torch.tensor([prompt])
        want = lm.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=NEW_TOKENS,
                           min_new_tokens=NEW_TOKENS, pad_token_id=0)[0].tolist()
    assert got == want and len(got) == len(prompt) + NEW_TOKENS


def test_text_generation_refuses_what_it_does_not_build(decoders, tmp_path):
    import torch

    torch.manual_seed(0)
    FAMILIES["bert"]().save_pretrained(tmp_path / "tiny-bert")
    proc = run_cli_here("build", "tiny-bert", "--task", "text-generation", cwd=tmp_path)
    assert_clean_failure(proc, 2, "needs a Hugging Face causal LM", out=tmp_path / "dist")
    proc = run_cli_here("build", str(decoder(decoders, "llama")), "--task", "text-generation", "--fp16", cwd=tmp_path)
    assert_clean_failure(proc, 2, "builds fp32, --int8 and --int4 for the cpu target", out=tmp_path / "dist")
    llama = str(decoder(decoders, "llama"))
    proc = run_cli_here("build", llama, "--task", "text-generation", "--backend", "inductor", cwd=tmp_path)
    assert_clean_failure(proc, 2, "--backend inductor has no recipe for it", out=tmp_path / "dist")
    proc = run_cli_here("build", llama, "--task", "text-generation", "--recipe", "fp32-onnxruntime", cwd=tmp_path)
    assert_clean_failure(proc, 2, "recipe fp32-onnxruntime builds the logits graph, not text-generation",
                         out=tmp_path / "dist")
    proc = run_cli_here("build", llama, "--task", "text-generation", "--recipe", "int4-onnxruntime-genai", "--int8",
                        cwd=tmp_path)
    assert_clean_failure(proc, 2, "recipe int4-onnxruntime-genai builds int4, and int8 was asked", out=tmp_path / "dist")
    proc = run_cli_here("build", llama, "--recipe", "int4-onnxruntime-genai", "--dry-run", "--json", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]  # a causal LM with the task's recipe: text generation's plan
    plan = json.loads(proc.stdout)
    assert plan["task"] == "text-generation" and not (tmp_path / "dist").exists()
    assert [c["recipe"] for c in plan["candidates"]] == ["int4-onnxruntime-genai"]
    assert plan["candidates"][0]["passes"][:2] == ["quantize_int4", "capture_kv_decoder"]
    proc = run_cli_here("build", llama, "--task", "logits", "--recipe", "fp32-onnxruntime-genai", cwd=tmp_path)
    assert_clean_failure(proc, 2, "builds text-generation, not the logits graph", "--task text-generation",
                         out=tmp_path / "dist")
    proc = run_cli_here("build", llama, "--task", "text-generation", "--dim", "seq=1:8:16", "--strict", cwd=tmp_path)
    assert_clean_failure(proc, 2, "--task text-generation does not take --dim, --strict", out=tmp_path / "dist")
    proc = run_cli_here("build", "tiny-bert", "--task", "translation", cwd=tmp_path)
    assert_clean_failure(proc, 2, "unknown --task 'translation'", out=tmp_path / "dist")
    FAMILIES["llama"]().save_pretrained(tmp_path / "no-tokenizer")
    proc = run_cli_here("build", "no-tokenizer", "--task", "text-generation", cwd=tmp_path)
    assert_clean_failure(proc, 2, "has no tokenizer", out=tmp_path / "dist")


def test_without_onnxruntime_genai_the_build_says_what_to_install(decoders, tmp_path):
    shim = tmp_path / "shim"
    shim.mkdir()
    (shim / "onnxruntime_genai.py").write_text("raise ImportError('No module named onnxruntime_genai')\n")
    proc = run_cli("build", str(decoder(decoders, "llama")), "--task", "text-generation", cwd=tmp_path,
                   env={"PYTHONPATH": f"{shim}:{ROOT}"})
    assert_clean_failure(proc, 4, "onnxruntime_genai, which is not installed", "pip install 'infopt[llm]'",
                         out=tmp_path / "dist")


def test_attention_stays_unfused_where_the_fused_op_would_not_compute_the_same():
    import torch

    from infopt.exporters.kv_attention import fusable

    torch.manual_seed(0)
    windowed = transformers.MistralForCausalLM(transformers.MistralConfig(
        vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=64, sliding_window=16))
    assert fusable(windowed, 64) == "a sliding window of 16 tokens, shorter than the context of 64"
    assert fusable(windowed, 16) is None  # a window as long as the context never cuts anything off
    assert fusable(FAMILIES["llama"](), 64) is None


@pytest.mark.slow
def test_a_chat_models_generation_config_changes_neither_the_reference_nor_where_the_folder_stops(decoders):
    """A chat checkpoint's ``generation_config.json`` (Qwen2.5-Instruct's: sampling, a repetition penalty, the
    turn's end token beside the config's): transformers' ``generate(do_sample=False)`` still applies its penalty
    and its end tokens, so a reference computed that way is not the argmax the folder decodes. The build judges
    the folder against the argmax, and the folder stops at every end token the model names."""
    import shutil

    import torch

    from infopt.validators.generation_eval import SAMPLES_FILE, GenerationSamples

    chat = decoders / "tiny-chat"
    if not chat.exists():
        shutil.copytree(decoder(decoders, "llama"), chat)
    lm = transformers.AutoModelForCausalLM.from_pretrained(chat).eval()
    config_end = lm.config.eos_token_id
    tokenizer = transformers.AutoTokenizer.from_pretrained(chat)
    lines = (decoders / "prompts.txt").read_text().splitlines()
    with torch.inference_mode():  # the token the model picks most often after the prompts: a second end token
        picked = [t for line in lines for t in lm.generate(torch.tensor([tokenizer(line)["input_ids"][:32]]),
                                                           do_sample=False, max_new_tokens=16)[0, 32:].tolist()]
    turn_end = max(set(picked) - {config_end}, key=picked.count)
    (chat / "generation_config.json").write_text(json.dumps({
        "do_sample": True, "temperature": 0.7, "top_k": 20, "top_p": 0.8, "repetition_penalty": 1.1,
        "bos_token_id": lm.config.bos_token_id, "eos_token_id": [config_end, turn_end]}))

    proc = run_cli("build", "tiny-chat", "--task", "text-generation", "--val", "prompts.txt", "-q", cwd=decoders,
                   timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    dist = decoders / "dist" / "tiny-chat"
    manifest = json.loads((dist / "manifest.json").read_text())
    assert manifest["validation"]["generation"]["greedy"]["equal"] == 4
    folder = json.loads((dist / "servers" / "onnxruntime-genai" / "genai_config.json").read_text())
    assert folder["model"]["eos_token_id"] == [config_end, turn_end]
    # the reference is the argmax with the end tokens held off, which the checkpoint's settings would have changed
    samples = GenerationSamples.load(dist / SAMPLES_FILE)
    lm = transformers.AutoModelForCausalLM.from_pretrained(chat).eval()
    with torch.inference_mode():
        as_configured = [lm.generate(torch.tensor([prompt]), do_sample=False, max_new_tokens=16,
                                     min_new_tokens=16)[0, len(prompt):].tolist() for prompt in samples.prompts]
    assert as_configured != samples.reference_tokens
    assert not any(turn_end in tokens for tokens in samples.reference_tokens)


@pytest.mark.slow
def test_the_python_api_builds_a_causal_lm_as_text_generation_by_default(decoders, tmp_path, capsys):
    import torch

    import infopt
    from infopt.core.errors import UsageError

    folder = decoder(decoders, "llama")
    result = infopt.build(folder, output=tmp_path / "api", val=decoders / "prompts.txt", progress=False)
    assert result.passed and result.output_dir == tmp_path / "api"
    manifest = json.loads((tmp_path / "api" / "manifest.json").read_text())
    assert manifest["source"]["task"]["name"] == "text-generation"
    assert manifest["validation"]["generation"]["greedy"]["equal"] == 4
    from infopt.validators.generation import generate_folder

    # the consumer loads the folder as written and generates from it (the 4 new tokens)
    assert [len(t) for t in generate_folder(tmp_path / "api" / "servers" / "onnxruntime-genai", [[5, 6, 7]], 4)] == [4]

    # a causal LM kept on logits says why; an argument only the logits graph takes keeps it there
    plan = infopt.build(folder, dims=["seq=1:8:16"], dry_run=True)
    assert plan["dry_run"] and "text-generation" not in json.dumps(plan)
    assert "task='text-generation', does not take dims=" in capsys.readouterr().err
    with pytest.raises(UsageError, match=r"does not take dims") as refused:
        infopt.build(folder, task="text-generation", dims=["seq=1:8:16"], dry_run=True)
    assert "dry_run" not in refused.value.what
    with pytest.raises(UsageError, match=r"does not take backend"):
        infopt.build(folder, task="text-generation", backend="inductor")
    plan = infopt.build(folder, dry_run=True, precision="int4", output=tmp_path / "planned")
    assert plan["task"] == "text-generation" and not (tmp_path / "planned").exists()
    assert plan["candidates"][0]["recipe"] == "int4-onnxruntime-genai"
    with pytest.raises(UsageError, match="unknown task 'translation'"):
        infopt.build(folder, task="translation")
    with pytest.raises(UsageError, match="not a Linear"):
        infopt.build(torch.nn.Linear(2, 2), task="text-generation")
    assert not (tmp_path / "dist").exists()


@pytest.mark.slow
def test_unfused_attention_concatenates_its_cache_and_still_generates_what_transformers_generates(decoders, tmp_path):
    """Where attention stays as transformers writes it (a sliding window shorter than the context), the
    present cache is a new tensor each step: the folder must not ask ONNX Runtime GenAI for a shared buffer."""
    import onnx

    from infopt.api.orchestrator import build_generation

    folder = decoder(decoders, "llama")
    result = build_generation(folder, output=tmp_path / "unfused", val=decoders / "prompts.txt", attention="unfused")
    manifest = json.loads((result.output_dir / "manifest.json").read_text())
    assert manifest["validation"]["generation"]["greedy"]["equal"] == 4
    genai = result.output_dir / "servers" / "onnxruntime-genai"
    assert json.loads((genai / "genai_config.json").read_text())["search"]["past_present_share_buffer"] is False
    assert "GroupQueryAttention" not in {n.op_type for n in onnx.load(str(genai / "model.onnx")).graph.node}


@pytest.mark.slow
def test_a_decoder_stored_as_external_data_is_fused_and_packed_too(decoders, tmp_path, monkeypatch):
    """A model over 1.8 GB is exported with its tensors in ``model.onnx.data``; the norm fusions and the packed
    projections apply to it as to a small one, and the folder keeps the data file beside the graph (the
    threshold is lowered here so that the tiny Llama takes that path)."""
    import onnx

    import infopt.api.generation_share as generation_api
    import infopt.core.tensor_file as tensor_file
    import infopt.passes.lower.onnx_export as onnx_export
    from infopt.api.orchestrator import build_generation
    from infopt.core.file_hash import sha256
    from infopt.core.manifest import read_manifest, verify_files
    from infopt.validators.generation_eval import SAMPLES_FILE, GenerationSamples

    monkeypatch.setattr(onnx_export, "EXTERNAL_DATA_BYTES", 10_000)
    monkeypatch.setattr(tensor_file, "INLINE_BYTES", 1024)  # fuse_decoder streams the tensors from file to file
    copied = []
    monkeypatch.setattr(tensor_file, "_copy_range", lambda *a, real=tensor_file._copy_range: (copied.append(a[3]), real(*a)))
    monkeypatch.setattr(generation_api, "JUDGED_PARAMETERS", 1000)  # judged on part of the samples, as a model past 0.1B is
    folder = decoder(decoders, "llama")
    result = build_generation(folder, output=tmp_path / "external", val=decoders / "prompts.txt")
    manifest = json.loads((result.output_dir / "manifest.json").read_text())
    judged = manifest["validation"]["generation"]
    assert judged["greedy"]["equal"] == 4 and judged["greedy"]["new_tokens"] == generation_api.MIN_NEW_TOKENS
    # its TPOT runs generate the same share of tokens, after no warm-up: the judging has just run the folder
    assert judged["new_tokens"] == generation_api.MIN_NEW_TOKENS and judged["warmed_by_judging"] is True
    assert all(r["samples"] == r["runs"] * (generation_api.MIN_NEW_TOKENS - 1) for r in judged["tpot"])
    forced = judged["teacher_forced"]
    # a float32 build has no teacher-forced budget (its greedy tokens must be equal): its figures are those of the
    # greedy check's four prompts, from the logits of their prefill on the model and on the folder
    notes = " ".join(manifest["validation"]["notes"])
    assert forced["sequences"] == 4 and "the prompts' prefill for the teacher-forced figures" in notes
    assert "from the greedy check's prompts (their prefill" in notes
    samples = GenerationSamples.load(result.output_dir / SAMPLES_FILE)
    assert samples.forced_on_prompts and samples.held_out == samples.prompts
    assert forced["tokens"] == sum(len(p) for p in samples.prompts)
    low, high = forced["top1_interval"]
    assert 0 <= low <= forced["top1"] <= high <= 1 and high - low > 0
    assert any("judged on a share of the samples" in note for note in manifest["validation"]["notes"])
    # the weights stored once: the GenAI folder's model is the output's model (no model/ copy), its tensors' file
    # hashed while the folder was judged, and rightly
    written = read_manifest(result.output_dir)
    assert written.artifacts.model == "servers/onnxruntime-genai/model.onnx"
    assert not (result.output_dir / "model").exists() and not any(rel.startswith("model/") for rel in written.files)
    rel = "servers/onnxruntime-genai/model.onnx.data"
    assert written.files[rel].sha256 == sha256(result.output_dir / rel)
    assert verify_files(result.output_dir, written.files) == []
    genai = result.output_dir / "servers" / "onnxruntime-genai"
    graph = onnx.load(str(genai / "model.onnx"), load_external_data=False).graph
    assert (genai / "model.onnx.data").stat().st_size > (genai / "model.onnx").stat().st_size
    assert all(t.data_location == onnx.TensorProto.EXTERNAL for t in graph.initializer if len(t.dims) == 2)
    ops = [n.op_type for n in graph.node]
    assert "SkipSimplifiedLayerNormalization" in ops and ops.count("MatMul") == LAYERS * 4 + 1, sorted(ops)
    assert all(n.input[1] == "" for n in graph.node if n.op_type == "GroupQueryAttention")  # packed QKV
    # the projections packed as the stamped decoder was written (per layer query/key/value, and gate/up), so the
    # fusions change only the graph and take the export's tensors' file over: the weights written once
    exported = next(p for p in manifest["passes"] if p["name"] == "onnx_export")
    assert exported["details"]["packed"] == 2 * LAYERS and f"x{2 * LAYERS}" in " ".join(exported["notes"])
    fused = next(p for p in manifest["passes"] if p["name"] == "fuse_decoder")
    rewrites = fused["details"]["rewrites"]
    assert "projections packed" not in rewrites and rewrites["attention ops taking packed QKV"] == LAYERS
    assert copied == []  # no tensor copied from file to file


@pytest.mark.slow
def test_past_the_judged_size_a_quantized_build_counts_the_prompts_prefill_and_runs_the_lines_after_them(
        decoders, tmp_path, monkeypatch):
    """A build a teacher-forced budget judges (INT8 here), of a model past JUDGED_PARAMETERS: its first figures are
    the greedy check's prompts' (the logits of their prefill, on the model and on the folder), and held-out lines
    after the prompts' make up MIN_FORCED_TOKENS; no token is counted twice. `infopt validate` judges the stored
    samples the same way and finds the same figures."""
    import infopt.api.generation_share as generation_api
    from infopt.api.generation_flow import HELD_OUT_TOKENS
    from infopt.api.orchestrator import build_generation
    from infopt.validators import generation
    from infopt.validators.generation_eval import SAMPLES_FILE, GenerationSamples

    monkeypatch.setattr(generation_api, "JUDGED_PARAMETERS", 1000)
    monkeypatch.setattr(generation_api, "FORCED_PARAMETER_TOKENS", 1)  # the floor alone, as at 1.2B and up
    monkeypatch.setattr(generation_api, "MIN_FORCED_TOKENS", 150)
    lines = [s for s in SENTENCES.read_text().splitlines() if s.strip()][300:340]
    (tmp_path / "val.txt").write_text("\n".join(lines) + "\n")
    folder = decoder(decoders, "llama")
    result = build_generation(folder, output=tmp_path / "out", val=tmp_path / "val.txt", precision="int8",
                              max_drift="top1=0,ppl_delta=100")
    manifest = json.loads((result.output_dir / "manifest.json").read_text())
    samples = GenerationSamples.load(result.output_dir / SAMPLES_FILE)
    assert samples.forced_on_prompts and samples.held_out[:4] == samples.prompts
    after = generation.text_ids(tmp_path / "val.txt", folder, "--val", 40, HELD_OUT_TOKENS, 2, skip=4)
    rest = samples.held_out[4:]
    assert rest and rest == after[:len(rest)]  # the lines after the prompts', in order
    assert not any(row[:len(p)] == p for row in rest for p in samples.prompts)
    prompt_tokens = sum(map(len, samples.prompts))
    assert prompt_tokens < 150 <= prompt_tokens + sum(map(len, rest))
    assert prompt_tokens + sum(map(len, rest[:-1])) < 150  # no line more than the floor needs
    forced = manifest["validation"]["generation"]["teacher_forced"]
    assert forced["tokens"] == prompt_tokens + sum(map(len, rest)) and forced["sequences"] == 4 + len(rest)
    notes = " ".join(manifest["validation"]["notes"])
    assert f"from the greedy check's prompts (their prefill) and {len(rest)} held-out sequence" in notes
    assert "the prompts' prefill for the teacher-forced figures and " in notes
    # the stored reference figures are those of each whole sequence through the model
    import torch

    lm = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    top1, nlls = generation.eager_figures(lm, samples.held_out)
    for want, got in zip(top1, samples.reference_top1):
        np.testing.assert_array_equal(got, want)
    for want, got in zip(nlls, samples.reference_nll):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
    proc = run_cli("validate", str(result.output_dir), "--json", timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    again = json.loads(proc.stdout)["generation"]["teacher_forced"]
    assert again["tokens"] == forced["tokens"] and again["top1"] == forced["top1"]
    assert again["ppl"] == pytest.approx(forced["ppl"], rel=1e-6)


def test_fusions_onnx_runtime_refuses_leave_the_export_and_its_tensors_file_as_they_were(decoders, tmp_path, monkeypatch):
    """fuse_decoder takes the export's tensors' file over (nothing to copy); where ONNX Runtime then refuses the fused
    graph, the file goes back and the folder is the export's, judged and passing."""
    import infopt.core.tensor_file as tensor_file
    import infopt.passes.decoder.fuse_decoder as fuse_decoder
    import infopt.passes.lower.onnx_export as onnx_export
    from infopt.api.orchestrator import build_generation

    monkeypatch.setattr(onnx_export, "EXTERNAL_DATA_BYTES", 10_000)
    monkeypatch.setattr(tensor_file, "INLINE_BYTES", 1024)
    monkeypatch.setattr(fuse_decoder, "onnxruntime_refuses", lambda *a, **k: "a refusal for the test")
    result = build_generation(decoder(decoders, "llama"), output=tmp_path / "refused", val=decoders / "prompts.txt")
    manifest = json.loads((result.output_dir / "manifest.json").read_text())
    fused = next(p for p in manifest["passes"] if p["name"] == "fuse_decoder")
    assert fused["details"]["refused"] == "a refusal for the test" and manifest["validation"]["verdict"]["passed"]
    assert manifest["validation"]["generation"]["greedy"]["equal"] == 4


def test_the_rotary_goes_inside_the_attention_op_only_where_a_table_of_positions_holds_it():
    import torch

    from infopt.exporters.kv_attention import rotary_caches
    from infopt.exporters.kv_decoder import cache_layout, decoder_module

    torch.manual_seed(0)
    llama = FAMILIES["llama"]().eval()
    cos, sin = rotary_caches(llama, 64, 16)
    assert cos.shape == sin.shape == (64, 8) and torch.allclose(cos[:, 0], torch.cos(torch.arange(64.0)))
    # the decoder with the rotary inside the op computes, eagerly, the logits transformers computes
    layout = cache_layout(llama)
    ids = torch.randint(3, 512, (1, 9))
    past = [torch.zeros(1, layout.kv_heads, 0, layout.head_size) for _ in range(2 * layout.layers)]
    with torch.no_grad():
        got = decoder_module(llama, layout, fused=True, rotary=(cos, sin))(ids, torch.ones_like(ids), *past)[0]
        want = llama(input_ids=ids).logits
    assert torch.allclose(got, want, atol=1e-4), (got - want).abs().max()
    assert rotary_caches(FAMILIES["gptneox"](), 64, 16) == (
        "its rotary width of 4 is not a multiple of 16, which ONNX Runtime's op needs")
    assert rotary_caches(FAMILIES["gpt2"](), 64, 16) == "no rotary embedding"
    config = transformers.LlamaConfig(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                                      rope_parameters={"rope_type": "dynamic", "factor": 2.0, "rope_theta": 10000.0})
    assert rotary_caches(transformers.LlamaForCausalLM(config), 64, 16) == (
        "its dynamic rope rescales with the sequence length")


@pytest.mark.slow
def test_the_judging_runs_prompts_of_one_length_together_and_the_timing_keeps_to_its_budget(decoders, tmp_path):
    """The greedy check and the teacher-forced logits run the rows of one length as one batch, on both sides, and
    give what they give one row at a time; the timing's rows past the budget are left out and say their predicted
    cost, the shortest prompt's TTFT and batch 1's TPOT always timed."""
    import torch

    import infopt
    from infopt.validators import generation

    folder = decoder(decoders, "llama")
    infopt.build(folder, output=tmp_path / "out", val=decoders / "prompts.txt", progress=False)
    genai_dir = tmp_path / "out" / "servers" / "onnxruntime-genai"
    lm = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    rng = np.random.default_rng(1)
    prompts = [rng.integers(3, 500, 6).tolist() for _ in range(3)] + [rng.integers(3, 500, 9).tolist()]
    assert generation.same_length_batches(prompts, 8) == [[0, 1, 2], [3]]
    assert generation.same_length_batches(prompts, 2) == [[0, 1], [2], [3]]
    assert generation.same_length_batches(prompts, 8, max_tokens=13) == [[0, 1], [2], [3]]
    for run in (lambda rows: generation.generate_folder(genai_dir, rows, 5),
                lambda rows: generation.generate_eager(lm, rows, 5)):
        together = run(prompts)
        assert together == [run([p])[0] for p in prompts] and {len(t) for t in together} == {5}
    assert generation.generate_folder(genai_dir, prompts, 5) == generation.generate_eager(lm, prompts, 5)
    for logits in (lambda rows: generation.teacher_forced(genai_dir, rows), lambda rows: generation.eager_logits(lm, rows)):
        together = logits(prompts)
        assert [x.shape for x in together] == [(len(p), 512) for p in prompts]
        for got, prompt in zip(together, prompts):
            np.testing.assert_allclose(got, logits([prompt])[0], rtol=1e-4, atol=1e-4)
    # the judging keeps each sequence's figures only, the same as computed from the whole logits
    for whole, kept in ((generation.teacher_forced(genai_dir, prompts), generation.teacher_forced_figures(genai_dir, prompts)),
                        (generation.eager_logits(lm, prompts), generation.eager_figures(lm, prompts))):
        for x, ids, top1, nll in zip(whole, prompts, *kept):
            np.testing.assert_array_equal(top1, x.argmax(-1))
            np.testing.assert_allclose(nll, generation.nll(x, ids), rtol=1e-5)
            assert top1.shape == (len(ids),) and nll.shape == (len(ids) - 1,)
    found = generation.agreement_of(*generation.eager_figures(lm, prompts), *generation.teacher_forced_figures(genai_dir, prompts))
    assert found == generation.agreement(generation.eager_logits(lm, prompts), generation.teacher_forced(genai_dir, prompts), prompts)
    assert found["tokens"] == sum(map(len, prompts)) and found["top1"] > 0.99 and abs(found["ppl_delta"]) < 1e-3

    rows = generation.time_generation(genai_dir, 512, [8, 16, 32], [1, 4, 8], 4, budget_s=0.0, every_row=False)
    assert [r["prompt_tokens"] for r in rows["ttft"]] == [8] and [r["batch"] for r in rows["tpot"]] == [1]
    assert sorted((r["kind"], r.get("prompt_tokens", r.get("batch"))) for r in rows["left_out"]) == [
        ("tpot", 4), ("tpot", 8), ("ttft", 16), ("ttft", 32)]
    assert all(r["predicted_ms"] > 0 for r in rows["left_out"])
    every = generation.time_generation(genai_dir, 512, [8, 16, 32], [1, 4, 8], 4, budget_s=0.0)
    assert [r["prompt_tokens"] for r in every["ttft"]] == [8, 16, 32] and every["left_out"] == []
    assert [(r["batch"], r["runs"], r["samples"]) for r in every["tpot"]] == [(1, 1, 3), (4, 1, 3), (8, 1, 3)]
