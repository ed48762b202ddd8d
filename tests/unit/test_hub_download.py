"""Hub ids download through huggingface_hub (honouring HF_ENDPOINT and HF_HUB_OFFLINE).

huggingface_hub reads those variables when it is imported, so each case runs `resolve_model_dir` in a
fresh interpreter with the environment a user would set, against a local server that answers the Hub's
endpoints (tests/hub_server.py) with a tiny model saved the way `save_pretrained` writes it.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.hub_server import serve_hub
from tests.tiny_models import tiny_lm

REPO = "tiny-org/tiny-qwen2"
RESOLVE = """
import sys
from relm.errors import UserError
from relm.models.loading import resolve_model_dir
for repo_id in sys.argv[1:]:
    try:
        print("ok", resolve_model_dir(repo_id))
    except UserError as exc:
        print("error:", exc)
"""


@pytest.fixture(scope="module")
def repo_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("hub") / "tiny-qwen2"
    tiny_lm().save_pretrained(folder)
    # A pickled copy as well, as many Hub repos have: it must not be downloaded beside safetensors.
    torch.save({}, folder / "pytorch_model.bin")
    (folder / "flax_model.msgpack").write_bytes(b"not for torch")
    return folder


def resolve(repo_ids: list[str], hf_home: Path, **env: str) -> list[str]:
    """One line per id, `ok FOLDER` or `error: ...`, from one fresh interpreter (imports cost seconds)."""
    environ = {k: v for k, v in os.environ.items() if not k.startswith("HF_")}
    environ.update(HF_HOME=str(hf_home), HF_HUB_DISABLE_PROGRESS_BARS="1", **env)
    run = subprocess.run(
        [sys.executable, "-c", RESOLVE, *repo_ids], capture_output=True, text=True, env=environ, check=False
    )
    assert run.returncode == 0, run.stderr
    return run.stdout.strip().splitlines()


def test_hub_ids_download_from_hf_endpoint_then_load_offline(repo_folder: Path, tmp_path: Path):
    hf_home = tmp_path / "hf"
    with serve_hub({REPO: repo_folder}) as (endpoint, requested):
        downloaded, missing = resolve([REPO, "tiny-org/no-such-model"], hf_home, HF_ENDPOINT=endpoint)
    folder = Path(downloaded.removeprefix("ok "))
    assert (folder / "config.json").is_file() and (folder / "model.safetensors").is_file()
    assert not (folder / "pytorch_model.bin").exists() and not (folder / "flax_model.msgpack").exists()
    assert any("/resolve/" in line and "model.safetensors" in line for line in requested)
    assert not any("/resolve/" in line and "pytorch_model.bin" in line for line in requested)
    assert missing.startswith(f"error: model `tiny-org/no-such-model` does not exist on {endpoint}")
    # The cache serves the downloaded model with the network off; a model never fetched gets a hint.
    cached, not_cached = resolve([REPO, "tiny-org/other"], hf_home, HF_HUB_OFFLINE="1")
    assert cached == f"ok {folder}"
    assert not_cached == (
        "error: model `tiny-org/other` is not in the local Hugging Face cache and HF_HUB_OFFLINE is set; "
        "unset HF_HUB_OFFLINE to download it, or pass a local folder"
    )
    # The server is gone: its port refuses connections, as on a machine without network.
    (down,) = resolve(["tiny-org/other"], hf_home, HF_ENDPOINT=endpoint)
    assert down.startswith(f"error: cannot download model `tiny-org/other` from {endpoint} (ConnectError")
