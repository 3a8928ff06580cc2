"""A text-generation build served by the real Triton Inference Server (the ``tritonserver`` that
``nvidia-pytriton`` ships, Python backend): its decoupled model generates with ``onnxruntime_genai`` from the
build's GenAI folder and answers Triton's generate endpoint, the greedy tokens transformers' ``generate`` gives,
whole (``/generate``) or one event per token (``/generate_stream``); ``infopt serve`` starts it and prints a
request that works."""

from __future__ import annotations

import json
import urllib.error
import urllib.request

import pytest

from tests.support.cli import assert_clean_failure, run_cli, run_cli_here
from tests.support.decoders import SENTENCES, decoder

pytest.importorskip("onnxruntime_genai")
transformers = pytest.importorskip("transformers")

from infopt.runtime.serving.triton_server import serving  # noqa: E402
from tests.support.served import triton_missing  # noqa: E402

NEW_TOKENS = 12


pytestmark = [pytest.mark.slow, pytest.mark.skipif(triton_missing() is not None, reason=triton_missing() or "")]


def _post(url: str, body: dict) -> bytes:
    ask = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(ask, timeout=120) as answer:
        return answer.read()


def _greedy(folder, prompt: str) -> list[int]:
    """The new tokens of transformers' greedy ``generate`` after ``prompt``, every token."""
    import torch

    ids = transformers.AutoTokenizer.from_pretrained(folder)(prompt)["input_ids"]
    lm = transformers.AutoModelForCausalLM.from_pretrained(folder).eval()
    with torch.inference_mode():
        out = lm.generate(torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                          do_sample=False, max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS, pad_token_id=0)
    return out[0, len(ids):].tolist()


def test_triton_generates_what_transformers_generates_and_infopt_serve_prints_a_request_that_works(tmp_path):
    from tests.support.served import serve_and_ask

    source = decoder(tmp_path, "llama")
    proc = run_cli("build", "tiny-llama", "-q", "--json", cwd=tmp_path, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    dist = tmp_path / "dist" / "tiny-llama"
    manifest = json.loads((dist / "manifest.json").read_text())
    assert manifest["artifacts"]["triton"] == "servers/triton/tiny-llama"
    config = (dist / "servers" / "triton" / "tiny-llama" / "config.pbtxt").read_text()
    assert "decoupled: true" in config and 'backend: "python"' in config
    assert not (dist / "servers" / "triton" / "tiny-llama" / "1" / "genai").exists()  # the weights stored once

    lines = [s for s in SENTENCES.read_text().splitlines() if s.strip()]
    prompt = " ".join(lines[470].split()[:8])  # a sentence no build saw, well within the tiny model's 64 positions
    want = _greedy(source, prompt)
    with serving(dist / "servers" / "triton", tmp_path / "work") as endpoints:
        base = f"http://{endpoints.http}/v2/models/tiny-llama"
        answer = json.loads(_post(f"{base}/generate", {"text_input": prompt, "max_tokens": NEW_TOKENS,
                                                       "min_tokens": NEW_TOKENS}))
        assert answer["output_ids"] == want, (answer, want)
        # the text is the tokenizer's streaming decode of those tokens (here of random weights' byte tokens, which
        # need not form whole characters, so it is not compared with transformers' text)
        assert isinstance(answer["text_output"], str) and answer["text_output"].strip()
        # streamed: one Server-Sent Event per token, the same tokens
        events = [json.loads(line[len("data: "):]) for line in _post(f"{base}/generate_stream", {
            "text_input": prompt, "max_tokens": NEW_TOKENS, "min_tokens": NEW_TOKENS, "stream": True}).decode().splitlines()
                  if line.startswith("data: ")]
        # (Triton's JSON writes a one-element tensor as its value)
        assert [e["output_ids"] if isinstance(e["output_ids"], int) else e["output_ids"][0] for e in events] == want
        assert all(isinstance(e["output_ids"], int) or len(e["output_ids"]) == 1 for e in events)
        assert "".join(e["text_output"] for e in events) == answer["text_output"]
        # a prompt longer than the context is the request's error, and the model serves on
        with pytest.raises(urllib.error.HTTPError) as refused:
            _post(f"{base}/generate", {"text_input": " ".join(["word"] * 400), "max_tokens": 4})
        assert "context holds 64" in refused.value.read().decode()
        assert json.loads(_post(f"{base}/generate", {"text_input": prompt, "max_tokens": NEW_TOKENS,
                                                     "min_tokens": NEW_TOKENS}))["output_ids"] == want

    # as a user runs it: infopt serve prints a curl to the generate endpoint, which answers; Ctrl-C stops it
    reply, printed, code = serve_and_ask(dist)
    assert code == 0 and "/v2/models/tiny-llama/generate" in printed, printed
    assert 1 <= len(reply["output_ids"]) <= 16 and isinstance(reply["text_output"], str)

    # what infopt serve cannot serve is exit 2, saying why
    assert_clean_failure(run_cli_here("serve", str(dist), "--server", "torchserve", cwd=tmp_path), 2,
                         "text-generation build, which TorchServe does not serve here")
