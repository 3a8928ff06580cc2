"""A bf16 checkpoint loaded for a float32 build: widened from the weights as stored, equal to transformers' own
float32 load, tied weights still tied, and no page of the checkpoint lost or changed."""

from __future__ import annotations

import threading
import time

import torch

from infopt.runtime.hf_folder import load_hf_folder
from tests.support.checkpoints import QWEN_COMMON, write_checkpoint

TINY = {**QWEN_COMMON, "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
        "num_key_value_heads": 2, "vocab_size": 512, "max_position_embeddings": 256, "bos_token_id": 0,
        "eos_token_id": 0, "tie_word_embeddings": True}


def test_a_bf16_checkpoint_widens_to_transformers_float32_load(tmp_path):
    import transformers

    write_checkpoint(TINY, tmp_path / "lm")
    lm = load_hf_folder(tmp_path / "lm").module.model
    expected = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "lm", dtype=torch.float32)
    assert {p.dtype for p in lm.parameters()} == {torch.float32} and lm.config.dtype == torch.float32
    assert lm.lm_head.weight is lm.model.embed_tokens.weight  # still tied
    theirs = expected.state_dict()
    assert all(torch.equal(value, theirs[name]) for name, value in lm.state_dict().items())
    again = load_hf_folder(tmp_path / "lm").module.model  # the file's pages handed back were read from it again
    assert all(torch.equal(value, theirs[name]) for name, value in again.state_dict().items())


def test_widening_hands_back_the_checkpoints_pages_as_it_goes(tmp_path):
    """The stored weights' pages, read to widen them, do not stay resident beside the float32 copy while it grows:
    RSS peaks at about the float32 bytes less the stored ones above where it was (with ``Module.float()``, whose
    pages stay until the last stored tensor goes, at the float32 bytes)."""
    from infopt.core.memory import release, resident_bytes
    from infopt.runtime.hf_folder import widen

    shape = {"hidden_size": 512, "intermediate_size": 2048, "num_hidden_layers": 8, "vocab_size": 8192}
    stored = write_checkpoint({**TINY, **shape}, tmp_path / "lm")
    growth = {}
    for how in ("module.float", "widen"):
        lm = load_hf_folder(tmp_path / "lm", stored_dtype=True).module.model
        assert sum(float(p.detach().sum()) for p in lm.parameters()) != 0.0  # every page read (as the reference's run does)
        release(0)  # what earlier tests freed, handed back: the growth measured is this one's
        before, peak, done = resident_bytes(), [0], threading.Event()

        def watch():
            while not done.is_set():
                peak[0] = max(peak[0], resident_bytes())
                time.sleep(0.001)

        watcher = threading.Thread(target=watch)
        watcher.start()
        lm.float() if how == "module.float" else widen(lm)
        done.set()
        watcher.join()
        growth[how] = max(peak[0], resident_bytes()) - before
        assert {p.dtype for p in lm.parameters()} == {torch.float32}
        del lm
    assert growth["module.float"] > 1.7 * stored  # the pages kept: the float32 copy on top of them
    assert growth["widen"] < 1.3 * stored, growth  # the float32 copy less the pages handed back
    print({how: f"{grown / stored:.2f}x" for how, grown in growth.items()})
