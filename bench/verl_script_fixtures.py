"""The model and data each verl example script is re-measured with: its own family, its own data format.

`bench/verl_scripts.py` used to give every command line `zoo:tiny/qwen2` and the built-in demo task. A
script for Qwen3-30B-A3B on DAPO-Math then tested a dense Qwen2 on letters, so neither the MoE path nor
DAPO's scorer was exercised. Here each model path (its last path component, as `Qwen/Qwen3-8B` or
`$HOME/models/Qwen2.5-Math-7B` names it) is placed in a family, and each family gets one tiny model
(2 layers, hidden 128, head_dim 64, 4 experts top-2 where the family is MoE), written once per run:

- the zoo's `tiny/*` config of that architecture where relm has one (Qwen2, Qwen3, Qwen3-MoE, Llama,
  Mistral), else transformers' own config class of the family shrunk the same way (DeepSeek-V3,
  gpt-oss, GLM-4.5, Seed-OSS, Qwen3-Next, ...), so relm meets the architecture as a user's checkpoint;
- the family's real tokenizer where ../shared/realworld/tokenizers has it (Qwen2.5's for every Qwen and
  MiMo model: Qwen3's is the same class and vocabulary family; Llama-3.2's; Mistral-Nemo's), else
  relm's character tokenizer (a `PreTrainedTokenizerFast`, the class those families' tokenizers are).

A family transformers has no class for (a model that ships its own code) is written as config.json and
tokenizer only, naming its architecture and model_type: what relm meets with the real checkpoint minus
the code, so the line shows what relm says about it.

Data files are placed by name: `gsm8k` gets GSM8K rows (../shared/realworld/data/gsm8k, as
examples/gsm8k_preprocess.py writes them, data_source `openai/gsm8k`), `dapo` DAPO-Math's layout (its
instruction and `Answer:` line, data_source `math_dapo`, MATH-500 problems), other `math` files verl's MATH
layout (`\\boxed{}`, data_source `DigitalLearningGmbH/MATH-lighteval`); anything else (hh-rlhf, tool
data) keeps relm's built-in task. Vision-language scripts (a `-VL` model, GLM-4.1V, MiniCPM-o, or
geo3k / video data) are not run: relm has no image inputs, and a text stand-in would measure nothing.
"""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
REALWORLD = REPO.parent / "shared" / "realworld"
ROWS = 64
"""Rows per training file (one step reads 4)."""

VISION_LANGUAGE = "not run: vision-language"
_VL_MODEL = re.compile(r"(^|[-_])vl([-_]|$)|glm-4\.1v|minicpm-o", re.IGNORECASE)
_VL_DATA = re.compile(r"geo3k|openr1mm|video", re.IGNORECASE)


@dataclass(frozen=True)
class Family:
    """One architecture the scripts name, and how its tiny stand-in is built."""

    name: str
    pattern: str
    """Searched (case-insensitive) in the model path's last component."""
    model_type: str
    architecture: str
    tokenizer: str | None
    """A folder under ../shared/realworld/tokenizers, or None for the character tokenizer."""
    zoo: str | None = None
    """relm's `tiny/*` zoo entry of this architecture, where it has one."""
    fields: tuple[tuple[str, Any], ...] = ()
    """Config fields over `_SHAPE` the family's config class insists on."""


# First match wins: the specific names before the general ones.
FAMILIES = (
    Family(
        "qwen3-next",
        r"qwen3-next",
        "qwen3_next",
        "Qwen3NextForCausalLM",
        "qwen2.5",
        # two layers of the default 3:1 pattern would both be linear attention; keep one of each kind
        fields=(("layer_types", ("linear_attention", "full_attention")),),
    ),
    Family("qwen3.5-moe", r"qwen3\.5-.*a\d+b", "qwen3_5_moe_text", "Qwen3_5MoeForCausalLM", "qwen2.5"),
    Family("qwen3.5", r"qwen3\.5", "qwen3_5_text", "Qwen3_5ForCausalLM", "qwen2.5"),
    Family(
        "qwen3-moe", r"qwen3-.*(a\d+b|moe)", "qwen3_moe", "Qwen3MoeForCausalLM", "qwen2.5", "tiny/qwen3-moe"
    ),
    Family("qwen3", r"qwen3", "qwen3", "Qwen3ForCausalLM", "qwen2.5", "tiny/qwen3"),
    Family("qwen2", r"qwen2", "qwen2", "Qwen2ForCausalLM", "qwen2.5", "tiny/qwen2"),
    Family("mimo", r"mimo", "mimo", "MiMoForCausalLM", "qwen2.5"),
    Family("llama", r"llama", "llama", "LlamaForCausalLM", "llama3.2", "tiny/llama"),
    Family("mistral", r"mistral", "mistral", "MistralForCausalLM", "mistral-nemo", "tiny/mistral"),
    Family(
        "deepseek-v4",
        r"deepseek-v4",
        "deepseek_v4",
        "DeepseekV4ForCausalLM",
        None,
        fields=(("q_lora_rank", 32),),
    ),
    Family(
        "deepseek-v3",
        r"deepseek-v3|dsv3|moonlight",
        "deepseek_v3",
        "DeepseekV3ForCausalLM",
        None,
        # head_dim is the rotary part's width (qk_rope_head_dim), as DeepSeek-V3's config sets it. MLA
        # expands its latent into one key and value per query head, so the family's configs have as many
        # key-value heads as heads (128/128, Moonlight's 16/16); with fewer, transformers' eager attention
        # repeats the already full heads again and the shapes disagree (2 vs 4).
        fields=(("head_dim", 32), ("num_key_value_heads", 2)),
    ),
    Family("gpt-oss", r"gpt-oss", "gpt_oss", "GptOssForCausalLM", None),
    Family("glm4-moe", r"glm-4\.5", "glm4_moe", "Glm4MoeForCausalLM", None),
    Family("seed-oss", r"seed-oss", "seed_oss", "SeedOssForCausalLM", None),
    Family("nemotron-h", r"nemotron", "nemotron_h", "NemotronHForCausalLM", None),
    Family("hunyuan-v3", r"hy3|hunyuan", "hy_v3", "HYV3ForCausalLM", None),
)

_SHAPE: dict[str, Any] = dict(
    hidden_size=128,
    intermediate_size=256,
    num_hidden_layers=2,
    num_attention_heads=2,
    num_key_value_heads=1,
    head_dim=64,
    max_position_embeddings=1024,
    # MoE families (each config class reads the names it knows)
    num_experts=4,
    num_local_experts=4,
    n_routed_experts=4,
    n_shared_experts=1,
    num_experts_per_tok=2,
    moe_intermediate_size=64,
    n_group=1,
    topk_group=1,
    first_k_dense_replace=1,
    # MLA (DeepSeek-V3's attention), as the zoo's tiny/deepseek-v2
    kv_lora_rank=32,
    q_lora_rank=None,
    qk_nope_head_dim=32,
    qk_rope_head_dim=32,
    v_head_dim=64,
)


def family_of(model_path: str) -> Family | None:
    """The family a script's model path names (None: not one of them)."""
    name = model_path.rstrip("/").rsplit("/", 1)[-1]
    for family in FAMILIES:
        if re.search(family.pattern, name, re.IGNORECASE):
            return family
    return None


def is_vision_language(model_paths: list[str], data_files: list[str]) -> bool:
    """A line whose model reads images or whose data holds them."""
    names = [path.rstrip("/").rsplit("/", 1)[-1] for path in model_paths]
    return any(_VL_MODEL.search(name) for name in names) or any(_VL_DATA.search(path) for path in data_files)


def _tokenizer(family: Family) -> Any:
    from transformers import AutoTokenizer

    from relm.models.char_tokenizer import build_char_tokenizer

    if family.tokenizer is not None and (REALWORLD / "tokenizers" / family.tokenizer).is_dir():
        return AutoTokenizer.from_pretrained(str(REALWORLD / "tokenizers" / family.tokenizer))
    return build_char_tokenizer()


def write_family_model(family: Family, folder: Path, reward: bool = False) -> Path:
    """The family's tiny model (or, for a class transformers lacks, its config and tokenizer) in `folder`.

    `reward`: a reward model of the family instead, as Skywork-Reward-Llama-3.1 is one of Llama's: the
    same body under a one-label sequence-classification head (`...ForSequenceClassification`)."""
    import json

    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForSequenceClassification
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING_NAMES

    from relm.models.zoo_entries import ZOO

    if (folder / "config.json").is_file():
        return folder
    folder.mkdir(parents=True, exist_ok=True)
    tokenizer = _tokenizer(family)
    ids = dict(
        vocab_size=len(tokenizer),
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
    )
    tokenizer.save_pretrained(folder)
    if family.zoo is not None:
        config = ZOO[family.zoo].build_config(tokenizer)
        config.max_position_embeddings = _SHAPE[
            "max_position_embeddings"
        ]  # a DAPO prompt exceeds the zoo's 256
    elif family.model_type in CONFIG_MAPPING_NAMES:
        config = AutoConfig.for_model(family.model_type, **{**_SHAPE, **_lists(family.fields), **ids})
    else:
        # No class in transformers: the checkpoint would ship code; relm meets the config as it is.
        (folder / "config.json").write_text(
            json.dumps(
                {"architectures": [family.architecture], "model_type": family.model_type, **_SHAPE, **ids}
            )
        )
        return folder
    torch.manual_seed(0)
    if reward:
        config.num_labels = 1
        config.architectures = [family.architecture.replace("ForCausalLM", "ForSequenceClassification")]
        model = AutoModelForSequenceClassification.from_config(config)
    else:
        model = AutoModelForCausalLM.from_config(config)
    model.save_pretrained(folder)
    return folder


def _lists(fields: tuple[tuple[str, Any], ...]) -> dict[str, Any]:
    """The fields as config kwargs (a tuple value, kept hashable in the frozen Family, as a list)."""
    return {key: list(value) if isinstance(value, tuple) else value for key, value in fields}


# --- data --------------------------------------------------------------------------------------------

DAPO_INSTRUCTION = (
    "Solve the following math problem step by step. The last line of your response should be of the form "
    "Answer: $Answer (without quotes) where $Answer is the answer to the problem.\n\n{problem}\n\n"
    'Remember to put your answer on its own line after "Answer:".'
)
MATH_INSTRUCTION = "Let's think step by step and output the final answer within \\boxed{}."


def data_kind(path: str) -> str:
    """`gsm8k`, `dapo`, `math` or `demo`: the format a script's data file name says it holds."""
    name = path.lower()
    if "gsm8k" in name:
        return "gsm8k"
    if "dapo" in name:
        return "dapo"
    if "math" in name:
        return "math"
    return "demo"


def _examples(name: str) -> Any:
    sys.path.insert(0, str(REPO / "examples"))
    try:
        return __import__(name)
    finally:
        sys.path.pop(0)


def _rows(kind: str, split: str) -> list[dict[str, Any]]:
    if kind == "gsm8k":
        gsm8k = _examples("gsm8k_preprocess")
        source = REALWORLD / "data" / "gsm8k" / f"{split}.jsonl"
        shortest = sorted(gsm8k.read_rows(source), key=lambda row: len(row["question"]))[:ROWS]
        return [gsm8k.convert_row(row, i, split) for i, row in enumerate(shortest)]
    math500 = _examples("math500_preprocess")
    # The shortest problems: every row fits the harness's prompt length, in a real tokenizer or in characters.
    problems = sorted(
        math500.read_rows(REALWORLD / "data" / "math500" / "test.jsonl"), key=lambda row: len(row["problem"])
    )
    problems = problems[:ROWS] if split == "train" else problems[ROWS : ROWS + 8]
    rows = []
    for index, problem in enumerate(problems):
        if kind == "dapo":
            content, source, style = DAPO_INSTRUCTION.format(problem=problem["problem"]), "math_dapo", "rule"
        else:
            content, source, style = (
                f"{problem['problem']} {MATH_INSTRUCTION}",
                "DigitalLearningGmbH/MATH-lighteval",
                "rule",
            )
        rows.append(
            {
                "data_source": source,
                "prompt": [{"role": "user", "content": content}],
                "ability": "math",
                "reward_model": {"style": style, "ground_truth": problem["answer"]},
                "extra_info": {"split": split, "index": index},
            }
        )
    return rows


def write_data(kind: str, folder: Path) -> tuple[Path, Path]:
    """(train, val) parquet files of `kind` in `folder` (the demo task's for `demo`)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from relm.data.demo_task import write_demo_parquet

    target = folder / kind
    if kind == "demo":
        return write_demo_parquet(target, num_train=ROWS, num_val=8)
    paths = (target / "train.parquet", target / "test.parquet")
    if not paths[0].is_file():
        target.mkdir(parents=True, exist_ok=True)
        for path, split in zip(paths, ("train", "test"), strict=True):
            pq.write_table(pa.Table.from_pylist(_rows(kind, split)), path)
    return paths


DATA_SOURCES = {
    "gsm8k": "openai/gsm8k",
    "dapo": "math_dapo",
    "math": "DigitalLearningGmbH/MATH-lighteval",
    "demo": "relm/letters",
}
"""The data_source each kind's rows name (the demo's is `relm.data.demo_task.DEMO_DATA_SOURCE`)."""
