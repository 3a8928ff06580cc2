"""Hugging Face hub ids as a model source: ``org/name`` or ``org/name@revision``.

A source that is not a path on disk and reads as a hub id is fetched with ``huggingface_hub``'s
``snapshot_download`` into its own cache (``HF_HOME`` / ``HF_HUB_CACHE``), only the files a build
reads (config, safetensors weights, tokenizer, sentence-transformers modules), and then loaded as the
Hugging Face folder it is. ``HF_HUB_OFFLINE=1`` is respected: the cache is used and nothing is
fetched; a model that is not in the cache then is an environment problem (exit 4) that says how to
get it. The commit the revision resolved to is recorded in the manifest's ``source.hub``.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

from infopt.core.errors import EnvironmentProblem, ModelLoadError

HUB_ID = re.compile(r"^(?P<repo>[A-Za-z0-9][\w.-]*/[A-Za-z0-9][\w.-]*)(?:@(?P<revision>[\w./-]+))?$")

WANTED = ["*.json", "*.safetensors", "*.txt", "*.model", "tokenizer*", "1_Pooling/*", "2_Normalize/*"]
"""What a build reads from a repository; pickled weights (``*.bin``), ONNX and other exports are left on the hub."""


@dataclass(frozen=True)
class HubSnapshot:
    repo_id: str
    revision: str
    """as asked (``main`` when not given)"""
    commit: str
    """the commit the revision resolved to: the snapshot folder's name"""
    folder: Path

    def to_json(self) -> dict[str, str]:
        return {"repo_id": self.repo_id, "revision": self.revision, "commit": self.commit}


MODEL_FILE_SUFFIXES = (".pt", ".pt2", ".pth", ".onnx", ".ts", ".jit", ".ckpt", ".bin", ".safetensors", ".pkl", ".zip")
"""what a model file's name ends in: ``fx/model.pt`` that does not exist is a mistyped path, not a repository"""


def is_hub_id(source: str | Path) -> bool:
    """A string that names no file or folder here and reads as ``org/name[@revision]``, unless it reads
    as a path that is missing: a model file's suffix, or a first part that is a folder here."""
    text = str(source)
    match = HUB_ID.match(text)
    if match is None or Path(text).exists():
        return False
    repo = match["repo"]
    return not repo.lower().endswith(MODEL_FILE_SUFFIXES) and not Path(repo).parent.is_dir()


def offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "true", "yes", "on")


def snapshot(source: str) -> HubSnapshot:
    """The repository's files at the revision, from the hub cache (fetched there first when online)."""
    match = HUB_ID.match(source)
    if match is None:
        raise ModelLoadError(f"{source!r} is not a Hugging Face model id", fix="give org/name or org/name@revision")
    repo, revision = match["repo"], match["revision"] or "main"
    try:
        from huggingface_hub import snapshot_download
        from huggingface_hub.constants import HF_HUB_CACHE
        from huggingface_hub.errors import LocalEntryNotFoundError, RepositoryNotFoundError, RevisionNotFoundError
    except ImportError as exc:
        raise EnvironmentProblem("Hugging Face model ids need huggingface_hub", fix="pip install 'infopt[llm]'") from exc
    try:
        folder = Path(snapshot_download(repo, revision=revision, allow_patterns=WANTED))
    except LocalEntryNotFoundError as exc:
        why = "HF_HUB_OFFLINE is set" if offline() else "the hub could not be reached"
        raise EnvironmentProblem(f"{repo}@{revision} is not in the Hugging Face cache and {why} (and no file or folder "
                                 f"here is named {source})",
                                 where=str(HF_HUB_CACHE),
                                 fix=f"fetch it once where the hub is reachable (hf download {repo} --revision {revision}), "
                                     "point HF_HUB_CACHE at a cache that has it, or pass a local folder") from exc
    except RevisionNotFoundError as exc:
        raise ModelLoadError(f"{repo} has no revision {revision!r}", fix="give a branch, tag or commit the repository has") from exc
    except RepositoryNotFoundError as exc:
        raise ModelLoadError(f"no Hugging Face repository {repo} (or it is private and no token is set)",
                             fix="check the id on huggingface.co, or log in with `hf auth login` for a private one") from exc
    return HubSnapshot(repo, revision, folder.name, folder)

