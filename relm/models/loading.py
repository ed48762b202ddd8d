"""Turn `model.path` into a causal LM on a device, or a `UserError` that says why it cannot be one.

Everything that builds a policy, reference or critic goes through `load_causal_lm`, so the checks
(is this a decoder-only text model? does every override key exist?) and the RL-specific settings
(no dropout, sdpa attention) are applied in exactly one place.
"""

from __future__ import annotations

import contextlib
import functools
import json
import logging
import os
import pickle
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from torch import nn
from transformers import AutoConfig, AutoModelForCausalLM, GenerationConfig, PretrainedConfig, PreTrainedModel
from transformers.models.auto.configuration_auto import CONFIG_MAPPING
from transformers.utils import SAFE_WEIGHTS_INDEX_NAME, SAFE_WEIGHTS_NAME, WEIGHTS_INDEX_NAME, WEIGHTS_NAME

from relm.config.paths import looks_like_local_path
from relm.errors import UserError
from relm.models.padding_probe import probe_padding_mask
from relm.models.registry import loads_text_model, non_causal_reason, registered_model_class
from relm.models.zoo import materialize_zoo

logger = logging.getLogger(__name__)

# The names `from_pretrained` reads; a shard never comes without its index. Matching these exactly
# (not any *.bin) keeps a trainer's `training_args.bin` or our own `value_head.safetensors` from
# passing for model weights.
_WEIGHT_FILE_NAMES = (SAFE_WEIGHTS_NAME, SAFE_WEIGHTS_INDEX_NAME, WEIGHTS_NAME, WEIGHTS_INDEX_NAME)

_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*(/[\w.-]+)?$")
# Keys that are loading arguments rather than config attributes.
_LOAD_KWARG_KEYS = frozenset({"attn_implementation"})


def resolve_model_dir(path: str) -> str:
    """A local folder holding `config.json` for `path` (`zoo:` name, local folder or cached Hub id).

    Raises:
        UserError: the folder is missing or has no config.json, or a Hub id is neither in the local
            cache nor downloadable (offline, unknown id, network failure).
    """
    if path.startswith("zoo:"):
        return str(materialize_zoo(path))
    local = Path(os.path.expanduser(path))
    if local.is_dir():
        if not (local / "config.json").is_file():
            raise UserError(
                f"model folder `{path}` has no config.json; pass the folder of a Hugging Face "
                "checkpoint (config.json plus weights)"
            )
        # Absolute: the model's name_or_path is what a LoRA checkpoint records as its base, and a path
        # relative to where training ran would not be found by an export or a resume from elsewhere.
        return os.path.abspath(local)
    if local.exists():
        raise UserError(f"model path `{path}` is a file; pass the folder that holds config.json")
    if looks_like_local_path(path) or not _HUB_ID.match(path):
        raise UserError(f"model folder `{path}` does not exist; check `model.path`")
    return _cached_hub_dir(path)


_NOT_FOR_TORCH = ["*.h5", "*.msgpack", "*.onnx", "*.onnx_data", "*.gguf", "*.tflite", "*.ot", "original/*"]
"""Other frameworks' copies of the weights in a Hub repo: never downloaded."""
_PICKLED_WEIGHTS = ["*.bin", "*.pth", "*.pt"]
"""Pickled torch weights: downloaded only for a repo that has no safetensors."""


def _cached_hub_dir(repo_id: str) -> str:
    """The HF-cache snapshot folder of `repo_id` with its weights, downloading what is missing.

    The local cache is looked at first, so a machine without network trains from it. Otherwise the
    model comes through `huggingface_hub.snapshot_download`, which honours `HF_ENDPOINT` (a mirror),
    `HF_HOME`/`HF_HUB_CACHE` and `HF_TOKEN`; with `HF_HUB_OFFLINE=1` nothing is downloaded.

    Raises:
        UserError: offline and not cached, the id does not exist (or is gated), or the download failed.
    """
    cached = _cached_folder(repo_id)
    if cached is not None and _has_weight_files(cached):
        return str(cached)
    from huggingface_hub import constants

    if constants.HF_HUB_OFFLINE:
        raise UserError(
            f"model `{repo_id}` is not in the local Hugging Face cache and HF_HUB_OFFLINE is set; unset "
            "HF_HUB_OFFLINE to download it, or pass a local folder"
        )
    folder = _download(repo_id, ignore=_NOT_FOR_TORCH + _PICKLED_WEIGHTS)
    if not _has_weight_files(folder):  # an older repo with only pytorch_model.bin
        folder = _download(repo_id, ignore=_NOT_FOR_TORCH)
    if not _has_weight_files(folder):
        raise UserError(
            f"model `{repo_id}` on {constants.ENDPOINT} has no weights relm can load (model.safetensors or "
            "pytorch_model.bin); pass a local folder with the weights"
        )
    return str(folder)


def _cached_folder(repo_id: str) -> Path | None:
    from transformers.utils import cached_file

    try:
        config_file = cached_file(repo_id, "config.json", local_files_only=True)
    except (OSError, ValueError):
        return None
    return Path(config_file).parent if config_file is not None else None


def _download(repo_id: str, *, ignore: list[str]) -> Path:
    from huggingface_hub import constants, snapshot_download
    from huggingface_hub.errors import GatedRepoError, HfHubHTTPError, RepositoryNotFoundError

    logger.info("downloading `%s` from %s", repo_id, constants.ENDPOINT)
    try:
        return Path(snapshot_download(repo_id, ignore_patterns=ignore))
    except GatedRepoError as exc:
        raise UserError(
            f"model `{repo_id}` is gated on {constants.ENDPOINT}; accept its terms on the model page and "
            "log in (`hf auth login` or HF_TOKEN), or pass a local folder"
        ) from exc
    except RepositoryNotFoundError as exc:
        raise UserError(
            f"model `{repo_id}` does not exist on {constants.ENDPOINT} (or is private: log in with "
            "`hf auth login` or HF_TOKEN); check `model.path`"
        ) from exc
    except (HfHubHTTPError, OSError, ValueError) as exc:  # LocalEntryNotFoundError (no network) is an OSError
        cause = exc.__cause__ or exc  # no network: huggingface_hub wraps the connection error
        reason = f"{type(cause).__name__}: {' '.join(str(cause).split())[:200]}"
        raise UserError(
            f"cannot download model `{repo_id}` from {constants.ENDPOINT} ({reason}); "
            "check the network or HF_ENDPOINT, or pass a local folder (HF_HUB_OFFLINE=1: cache only)"
        ) from exc


def unsafe_pickle_message(folder: str, exc: BaseException) -> str:
    """The one line for a `.bin` (pickle) weights file that holds more than tensors.

    torch loads pickles with `weights_only=True` (transformers 5 never passes False), which refuses any
    object but tensors and plain containers: unpickling anything else can run code. relm offers no key
    to load it regardless; the user converts the file once, where they trust it.
    """
    found = re.search(r"Unsupported global: GLOBAL ([\w.]+)", str(exc))
    what = f" ({found.group(1)})" if found else ""
    return (
        f"model folder `{folder}`: its pytorch_model*.bin weights are a pickle holding objects other than "
        f"tensors{what}, which relm does not load because unpickling them can run code; convert the "
        "weights to safetensors where you trust the file (torch.load(..., weights_only=False), then "
        "save_pretrained) and point the path at the converted folder"
    )


def _has_weight_files(folder: Path) -> bool:
    return any((folder / name).is_file() for name in _WEIGHT_FILE_NAMES)


def pick_dtype(name: str, device: torch.device | str) -> torch.dtype:
    """The torch dtype for a config string; `auto` is bf16 on CUDA and fp32 elsewhere.

    CPU bf16 matmuls are slow and lose precision the CPU tests rely on, hence fp32 there.
    """
    table = {"float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16}
    table |= {"bf16": torch.bfloat16, "float16": torch.float16, "fp16": torch.float16}
    if name == "auto":
        return torch.bfloat16 if torch.device(device).type == "cuda" else torch.float32
    if name not in table:
        raise UserError(f"dtype `{name}` is not one of auto, float32, bfloat16, float16")
    return table[name]


def load_config(
    path: str,
    *,
    override_config: dict[str, Any] | None = None,
    trust_remote_code: bool = False,
    trust_key: str = "actor_rollout_ref.model.trust_remote_code",
) -> tuple[str, PretrainedConfig, str | None]:
    """(model folder, checked config with dropout off and overrides applied, attn override or None).

    Dropout is zeroed before the overrides, so a user who wants dropout can still ask for it; by
    default it is off because the PPO ratio compares logprobs of two forwards of the same weights,
    and dropout noise would make that ratio differ from 1 with no update at all.
    """
    folder = resolve_model_dir(path)
    require_trusted_code(folder, path, trust_remote_code, trust_key)
    config = read_config(folder, path, trust_remote_code)
    _refuse_non_causal(config, path, trust_remote_code)
    _disable_dropout(config)
    attn_implementation = None
    for key, value in (override_config or {}).items():
        if key in _LOAD_KWARG_KEYS:
            attn_implementation = str(value)
        elif key == "rope_theta" and isinstance(getattr(config, "rope_parameters", None), dict):
            # transformers 5 moved rope_theta into rope_parameters; verl-era configs still set it.
            config.rope_parameters = {**config.rope_parameters, "rope_theta": value}
        elif hasattr(config, key) or key in config.to_dict():
            setattr(config, key, value)
        elif ("dropout" in key or key.endswith("pdrop")) and not value:
            # verl's DAPO scripts zero every family's dropout names (embd_pdrop, resid_pdrop, ...); relm
            # has zeroed this model's already, so a name it lacks asks for nothing.
            continue
        else:
            raise UserError(
                f"override_config key `{key}` is not an attribute of the {config.model_type} config of "
                f"`{path}`; check the spelling against its config.json"
            )
    return folder, config, attn_implementation


def require_trusted_code(folder: str, path: str, trust_remote_code: bool, trust_key: str) -> None:
    """Refuse, naming `trust_key`, a folder whose model exists only as its own code (unless trusted).

    A folder whose config.json maps to code (`auto_map`) for a model type transformers knows loads
    with transformers' own classes, so only an unknown type (and no relm-registered class) needs it.

    Raises:
        UserError: the model needs its own code and `trust_key` is false.
    """
    if trust_remote_code:
        return
    try:
        raw = json.loads((Path(folder) / "config.json").read_text())
    except (OSError, ValueError):
        return  # read_config reports it
    if not isinstance(raw, dict) or not raw.get("auto_map"):
        return
    declared = (raw.get("architectures") or [None])[0]
    if registered_model_class(declared) is not None or raw.get("model_type") in CONFIG_MAPPING:
        return
    raise UserError(
        f"model `{path}` exists only as Python code shipped in its folder (config.json's auto_map), which "
        f"runs when it loads; set `{trust_key}=true` if you trust that code"
    )


def read_config(folder: str, path: str, trust_remote_code: bool) -> PretrainedConfig:
    """The folder's config; a registered architecture's config is read by its class's config class.

    Raises:
        UserError: config.json is not JSON, or transformers cannot read it (with how to register
            an architecture transformers does not know).
    """
    try:
        raw = json.loads((Path(folder) / "config.json").read_text())
    except ValueError as exc:
        raise UserError(f"model `{path}`: config.json is not valid JSON ({exc})") from exc
    declared = (raw.get("architectures") or [None])[0]
    registered = registered_model_class(declared)
    if registered is not None:
        config_class = registered.config_class
        assert config_class is not None, "`register_architecture` refuses a class without one"
        config = config_class.from_pretrained(folder)
        # The folder's own model_type (unknown to transformers) would otherwise shadow the class's.
        config.model_type = config_class.model_type  # type: ignore[misc]  # on this instance, on purpose
        return config
    try:
        return AutoConfig.from_pretrained(folder, trust_remote_code=trust_remote_code)
    except ValueError as exc:
        reason = " ".join(str(exc).split()).split(". ")[0][:200]
        hint = ""
        if declared:
            hint = (
                f"; if {declared} is a known architecture under another name, register it first, e.g. "
                f"`relm compat --register {declared}=MistralForCausalLM` or "
                f"relm.models.registry.register_model_class('{declared}', 'MistralForCausalLM') "
                "in the module named by `model.external_lib`"
            )
        raise UserError(
            f"model `{path}`: transformers cannot read its config.json (model_type "
            f"`{raw.get('model_type')}`: {reason}){hint}"
        ) from exc


def _refuse_non_causal(config: PretrainedConfig, path: str, trust_remote_code: bool) -> None:
    reason = non_causal_reason(config, trust_remote_code)
    if reason is not None:
        raise UserError(f"model `{path}` ({getattr(config, 'model_type', '')}) {reason}")
    if getattr(config, "vision_config", None) is not None and loads_text_model(config):
        _say_text_model_only(path, getattr(config, "model_type", ""))


@functools.cache
def _say_text_model_only(path: str, model_type: str) -> None:
    """Once per model: relm decided to train a vision-language checkpoint's language model alone."""
    logger.warning(
        "model `%s` (%s) is a vision-language checkpoint: relm trains its language model, text only (the "
        "vision weights are not loaded; checkpoints and exports hold the text model)",
        path,
        model_type,
    )


def _disable_dropout(config: PretrainedConfig) -> None:
    for key, value in config.to_dict().items():
        is_rate = isinstance(value, float) and not isinstance(value, bool)
        if is_rate and ("dropout" in key or key.endswith("pdrop")):
            setattr(config, key, 0.0)


@contextlib.contextmanager
def parameters_on_meta() -> Iterator[None]:
    """Every parameter a module registers inside the block goes to the meta device; buffers do not.

    Why not `with torch.device("meta")`: that puts buffers there too, and a rotary embedding's
    frequencies, computed in its constructor and saved nowhere, would be lost. A parameter is made on
    the CPU by its layer (uninitialised: `torch.empty`) and moved at once, one at a time.
    """
    original = nn.Module.register_parameter

    def register(module: nn.Module, name: str, param: nn.Parameter | None) -> None:
        original(module, name, param)
        if param is not None and param.device.type != "meta":
            made = module._parameters[name]
            assert made is not None
            moved = nn.Parameter(made.to("meta"), requires_grad=made.requires_grad)
            moved.__dict__.update(made.__dict__)  # attributes a class set on its parameter
            module._parameters[name] = moved

    nn.Module.register_parameter = register  # type: ignore[method-assign,assignment]  # undone below
    try:
        yield
    finally:
        nn.Module.register_parameter = original  # type: ignore[method-assign]


def load_causal_lm(
    path: str,
    *,
    dtype: torch.dtype,
    device: torch.device | str,
    override_config: dict[str, Any] | None = None,
    trust_remote_code: bool = False,
    trust_key: str = "actor_rollout_ref.model.trust_remote_code",
    seed: int = 0,
    empty: bool = False,
) -> PreTrainedModel:
    """A decoder-only causal LM from `path`, on `device` in `dtype`, dropout off.

    A folder with a config but no weight files gives a model initialised from `seed`, with a warning:
    this is how configs of known models become benchmark and compatibility subjects without a
    download. `empty` builds the model's structure only: its parameters on the meta device (no
    memory), its buffers (rotary frequencies) computed on the CPU as the class makes them, for a
    data-parallel run that fills each rank's shards from the files (`relm.distributed.sharded_load`).
    A model with weights is asked, by two tiny forwards, whether it reads the attention mask
    (`relm.models.padding_probe`), and keeps the answer for the trainer's and the engines' forwards.

    Raises:
        UserError: see `resolve_model_dir`, plus: not a decoder-only text model; unknown override key.
    """
    folder, config, attn_override = load_config(
        path, override_config=override_config, trust_remote_code=trust_remote_code, trust_key=trust_key
    )
    # sdpa has no logit soft-capping and would silently drop Gemma 2's, so capped models get eager.
    capped = getattr(config.get_text_config(), "attn_logit_softcapping", None)
    attn_choices = [attn_override] if attn_override else (["eager"] if capped else ["sdpa", "eager"])
    for i, attn in enumerate(attn_choices):
        try:
            model = _build(
                folder,
                config,
                dtype=dtype,
                attn=attn,
                trust_remote_code=trust_remote_code,
                seed=seed,
                device=torch.device(device),
                empty=empty,
            )
            break
        except ValueError:
            # transformers refuses sdpa for architectures without it; eager always exists.
            if i + 1 == len(attn_choices):
                raise
            logger.info(
                "model `%s` refused attn_implementation=%s; trying %s", path, attn, attn_choices[i + 1]
            )
    # eval() as from_pretrained leaves it (from_config does not): the update loops call train().
    if empty:
        return model.eval()  # type: ignore[possibly-undefined]  # the last choice returns or raises
    model = model.eval().to(device)
    # Asked here, once, so that no step's forwards include the probe's (an empty model: on the engine's
    # whole copy once it is filled, `relm.trainer.components`).
    probe_padding_mask(model)
    return model


def _build(
    folder: str,
    config: PretrainedConfig,
    *,
    dtype: torch.dtype,
    attn: str,
    trust_remote_code: bool,
    seed: int,
    device: torch.device,
    empty: bool = False,
) -> PreTrainedModel:
    common: dict[str, Any] = {
        "dtype": dtype,
        "attn_implementation": attn,
        "trust_remote_code": trust_remote_code,
    }
    model_class = registered_model_class((getattr(config, "architectures", None) or [None])[0])
    builder: type[AutoModelForCausalLM] | type[PreTrainedModel] = AutoModelForCausalLM
    if model_class is not None:
        builder = model_class
        common.pop("trust_remote_code")  # a concrete class has its code already
    if empty:
        with parameters_on_meta():
            if model_class is not None:
                model = model_class._from_config(config, **common)
            else:
                model = AutoModelForCausalLM.from_config(config, **common)
        # from_pretrained reads the folder's generation config (its eos ids end responses); from_config
        # derives one from config.json, which may name fewer.
        if (Path(folder) / "generation_config.json").is_file():
            model.generation_config = GenerationConfig.from_pretrained(folder)
        return model
    if _has_weight_files(Path(folder)):
        try:
            return builder.from_pretrained(folder, config=config, **common)
        except OSError as exc:
            raise UserError(f"model folder `{folder}`: could not read its weights ({exc})") from exc
        except pickle.UnpicklingError as exc:
            raise UserError(unsafe_pickle_message(folder, exc)) from exc
    logger.warning("model folder `%s` has no weight files: using RANDOM weights (seed %d)", folder, seed)
    # A private RNG scope: seeding must make the weights reproducible without resetting the
    # caller's global random stream (data shuffling, sampling).
    # Built directly on the target device: a 7B model initialised on the CPU takes minutes.
    rng_devices = [device] if device.type == "cuda" else []
    with torch.random.fork_rng(devices=rng_devices), device:
        torch.manual_seed(seed)
        if model_class is not None:
            return model_class._from_config(config, **common)
        return AutoModelForCausalLM.from_config(config, **common)
