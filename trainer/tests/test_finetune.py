"""LLM fine-tuning on one GPU: Hugging Face models by config, pure low precision, LoRA, QLoRA,
checkpointing variants, optimizers, SDPA's backend choice, max-seq and the baselines."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest
import torch
from conftest import cli

from memtrace_trainer.errors import UserError
from memtrace_trainer.models import hf
from memtrace_trainer.models.finetune import Lora, Regime
from memtrace_trainer.models.qlora import Linear4bit, nf4_bytes
from memtrace_trainer.models.zoo import Tune, build_workload
from memtrace_trainer.profile import load_profile
from memtrace_trainer.symtrace.emulation import sdpa_backend
from memtrace_trainer.symtrace.step import StepConfig
from memtrace_trainer.symtrace.tracer import summarize, trace

CONFIGS = Path(__file__).parent / "hf_configs"
LLAMA = f"hf-config:{CONFIGS / 'tiny-llama.json'}"
T5 = f"hf-config:{CONFIGS / 'tiny-t5.json'}"


def workload(spec: str = LLAMA, batch: int = 2, seq: int = 64, **regime: Any) -> Any:
    tune = Tune(regime.pop("task", None), regime.pop("attn", None), None, Regime(**regime))
    return build_workload(spec, batch, seq_len=seq, tune=tune)


def traced(w: Any, **step: Any) -> tuple[dict[str, int], dict[str, Any], int]:
    """Bytes allocated per category over the steps, what was emulated, and the live peak."""
    rec, extra = trace(w, StepConfig(**{"optimizer": "adamw", **step}), load_profile(None))
    s = summarize(rec.events)
    return s.allocated_bytes_by_category, extra, s.peak_live_bytes


# --- the registry of published configs ----------------------------------------------------------


def test_every_registry_file_builds_a_config() -> None:
    ids = hf.known_ids()
    assert len(ids) > 100 and len(set(i.lower() for i in ids)) == len(ids)
    for repo_id in ids:
        config = hf.to_config(hf.resolve(repo_id))
        assert config.model_type == hf.resolve(repo_id).config["model_type"]


@pytest.mark.parametrize(
    ("repo_id", "parameters"),
    [
        # Published sizes (model cards / safetensors index totals).
        ("meta-llama/Meta-Llama-3-8B", 8_030_261_248),
        ("meta-llama/Llama-2-7b-hf", 6_738_415_616),
        ("mistralai/Mistral-7B-v0.1", 7_241_732_096),
        ("TinyLlama/TinyLlama-1.1B-Chat-v1.0", 1_100_048_384),
        ("Qwen/Qwen2.5-7B", 7_615_616_512),
        ("microsoft/phi-2", 2_779_683_840),
        ("gpt2", 124_439_808),
    ],
)
def test_published_parameter_counts(repo_id: str, parameters: int) -> None:
    w = build_workload(f"hf:{repo_id}", 1, seq_len=8)
    assert w.details["parameters"] == parameters


def test_unknown_id_names_the_nearest() -> None:
    with pytest.raises(UserError, match=r"nearest known: .*meta-llama/Meta-Llama-3-8B"):
        hf.resolve("meta-llama/Llama-3-8B")


@pytest.mark.parametrize(
    ("text", "expect"),
    [
        (None, "cannot read the file"),
        ("{not json", "not JSON"),
        ("[1, 2]", "expected a JSON object"),
        ('{"hidden_size": 8}', "field model_type is None"),
        ('{"model_type": "no-such-family"}', "field model_type 'no-such-family' is not a model"),
    ],
)
def test_bad_config_files_name_file_and_field(
    tmp_path: Path, text: str | None, expect: str
) -> None:
    path = tmp_path / "config.json"
    if text is not None:
        path.write_text(text)
    with pytest.raises(UserError, match=expect) as e:
        build_workload(f"hf-config:{path}", 1, seq_len=8)
    assert str(path) in str(e.value)


def test_default_task_and_seq_len_are_reported() -> None:
    w = build_workload("hf:bert-base-uncased", 1)
    assert w.defaults["task"]["value"] == "classification"
    assert w.defaults["num_classes"]["value"] == 2
    assert w.defaults["seq_len"]["value"] == 512
    w = build_workload("hf:meta-llama/Llama-3.1-8B", 1)
    assert w.defaults["seq_len"]["value"] == 2048  # capped: the model allows 131072
    assert "131072" in w.defaults["seq_len"]["why"]


def test_a_config_whose_architecture_and_model_type_disagree_is_warned(
    tmp_path: Path, capsys: Any
) -> None:
    """A Llama model_type with BertForMaskedLM was built as a Llama causal LM without a word,
    and a file without architectures was said to have published the task."""
    llama = json.loads((CONFIGS / "tiny-llama.json").read_text())
    path = tmp_path / "config.json"
    path.write_text(json.dumps({**llama, "architectures": ["BertForMaskedLM"]}))
    w = build_workload(f"hf-config:{path}", 1, seq_len=8)
    err = capsys.readouterr().err
    assert (
        f"{path}: its architectures ['BertForMaskedLM'] are bert models, but its model_type "
        "is 'llama'; transformers builds by model_type, so this is LlamaForCausalLM" in err
    )
    assert w.defaults["task"]["why"] == "the default for model_type llama"
    path.write_text(json.dumps({k: v for k, v in llama.items() if k != "architectures"}))
    w = build_workload(f"hf-config:{path}", 1, seq_len=8)
    assert w.defaults["task"]["why"] == (f"the default for model_type llama: {path} publishes "
                                         "no architectures")  # fmt: skip
    assert "architectures" not in capsys.readouterr().err
    # Agreeing fields: the published architecture, and no warning.
    w = build_workload(LLAMA, 1, seq_len=8)
    assert w.defaults["task"]["why"].endswith("tiny-llama.json's published architecture")
    assert "architectures" not in capsys.readouterr().err


@pytest.mark.parametrize(("spec", "task"), [(LLAMA, "causal-lm"), (LLAMA, "classification"),
                                            (T5, "seq2seq")])  # fmt: skip
def test_tasks_train(spec: str, task: str) -> None:
    cats, _, _ = traced(workload(spec, task=task, dtype="bf16"))
    assert cats["gradient"] > 0 and cats["optimizer_state"] > 0


def test_seq2seq_needs_an_encoder_decoder() -> None:
    with pytest.raises(UserError, match="not an encoder-decoder"):
        workload(LLAMA, task="seq2seq")


# --- regimes ---------------------------------------------------------------------------------


def test_pure_bf16_keeps_adamw_state_in_bf16() -> None:
    w = workload(dtype="bf16")
    params = w.details["parameters"]
    cats, _, _ = traced(w)
    assert cats["optimizer_state"] == 2 * 2 * params  # exp_avg + exp_avg_sq, 2 bytes each


def test_lora_optimizer_state_covers_only_the_adapters() -> None:
    w = workload(dtype="bf16", lora=Lora(8, targets=("q_proj", "v_proj")))
    trainable = w.details["trainable_parameters"]
    # 2 layers x r=8 x (q: 128+128, v: 128+64) adapters.
    assert trainable == 2 * 8 * (128 + 128 + 128 + 64)
    cats, _, _ = traced(w, iterations=2)
    # peft keeps adapters in fp32 (autocast_adapter_dtype): 2 fp32 states, 2 fp32 gradients.
    assert cats["optimizer_state"] == 2 * 4 * trainable
    assert cats["gradient"] == 2 * 4 * trainable  # one per step, two steps


def test_lora_dropout_copies_count() -> None:
    base = workload(dtype="bf16", lora=Lora(8, dropout=0.0))
    dropped = workload(dtype="bf16", lora=Lora(8, dropout=0.1))
    assert traced(dropped)[0]["activation"] > traced(base)[0]["activation"]


def test_qlora_base_storage_per_parameter() -> None:
    for double_quant, low, high in ((False, 0.5625, 0.5626), (True, 0.515, 0.52)):
        w = build_workload("hf:meta-llama/Meta-Llama-3-8B", 1, seq_len=8, tune=Tune(
            regime=Regime("bf16", qlora=True, double_quant=double_quant, lora=Lora(8))))  # fmt: skip
        layers = [m for m in w.model.modules() if isinstance(m, Linear4bit)]
        assert len(layers) == 32 * 7  # q, k, v, o, gate, up, down; lm_head stays bf16->fp32
        n = sum(m.in_features * m.out_features for m in layers)
        stored = sum(t.numel() * t.element_size() for m in layers for t in (m.weight, *m.buffers()))
        assert stored == sum(
            nf4_bytes(m.in_features * m.out_features, double_quant) for m in layers
        )
        assert low <= stored / n <= high
        assert not any(m.weight.requires_grad for m in layers)
        # prepare_model_for_kbit_training casts what is not 4-bit to fp32 (embeddings, head).
        head = w.model.get_output_embeddings()
        assert head.weight.dtype == torch.float32 and not head.weight.requires_grad
        # A 4-bit weight counts as the layer's weights, as peft counts it, not as its packed
        # bytes (the 8B model was reported as 4.5B parameters).
        plain = build_workload("hf:meta-llama/Meta-Llama-3-8B", 1, seq_len=8)
        lora = sum(p.numel() for p in w.model.parameters() if p.requires_grad)
        assert w.details["parameters"] == plain.details["parameters"] + lora


def test_a_full_rank_lora_and_an_unknown_bitsandbytes_are_said(tmp_path: Path) -> None:
    args = ("symtrace", "--model", LLAMA, "--batch-size", "1", "--seq-len", "8", "--steps", "1",
            "--out", str(tmp_path / "t.jsonl"))  # fmt: skip
    said = cli(*args, "--lora", "100000").stderr
    assert "--lora 100000: the rank reaches the smaller side of" in said
    assert "the rank reaches" not in cli(*args, "--lora", "8").stderr
    said = cli(*args, "--qlora", "--bnb-version", "9.9").stderr
    assert "--bnb-version 9.9 is newer than any release memtrace knows (0.50)" in said


def test_qlora_quantizes_gpt2s_conv1d_as_transformers_does() -> None:
    """transformers' bitsandbytes integration converts GPT-2's Conv1D (weight stored (in, out))
    to Linear4bit like any nn.Linear; --qlora refused GPT-2 as having no linear layers."""
    from transformers.pytorch_utils import Conv1D

    plain = workload("hf:gpt2", batch=1, seq=16, dtype="bf16")
    shapes = sorted(tuple(m.weight.shape) for m in plain.model.modules() if isinstance(m, Conv1D))
    w = workload("hf:gpt2", batch=1, seq=16, dtype="bf16", qlora=True, lora=Lora(8))
    layers = [m for m in w.model.modules() if isinstance(m, Linear4bit)]
    assert len(layers) == len(shapes) == 12 * 4  # c_attn, attn c_proj, c_fc, mlp c_proj
    assert sorted((m.in_features, m.out_features) for m in layers) == shapes
    assert not any(isinstance(m, Conv1D) for m in w.model.modules())
    traced(w, iterations=1)


@pytest.mark.parametrize("kbit_prepare", [True, False])
def test_qlora_keeps_what_transformers_keeps_unquantized(kbit_prepare: bool) -> None:
    """T5's `wo` (`_keep_in_fp32_modules`) is not quantized, and the whole classification head
    stays in full precision (memtrace's choice: peft trains it as `modules_to_save`). Both were
    quantized: T5's forward cast its activations to the packed uint8 dtype, and peft could not
    make RoBERTa's head trainable; each was an internal error. A bf16 load keeps `wo` in bf16
    (transformers upcasts it for fp16 loads only); kbit preparation casts it to fp32."""
    for dtype, expect in (("bf16", torch.float32 if kbit_prepare else torch.bfloat16),
                          ("fp16", torch.float32)):  # fmt: skip
        t5 = workload("hf:google-t5/t5-small", batch=1, seq=16, dtype=dtype, qlora=True,
                      lora=Lora(8), kbit_prepare=kbit_prepare)  # fmt: skip
        wo = [m for n, m in t5.model.named_modules() if n.endswith(".wo")]
        assert wo and all(type(m) is torch.nn.Linear and m.weight.dtype == expect for m in wo)
    assert any(isinstance(m, Linear4bit) for m in t5.model.modules())
    traced(t5, iterations=1)
    roberta = workload("hf:FacebookAI/roberta-base", batch=1, seq=16, dtype="bf16", qlora=True,
                       lora=Lora(8), kbit_prepare=kbit_prepare)  # fmt: skip
    head = [n for n, m in roberta.model.named_modules() if ".classifier." in f".{n}." and
            isinstance(m, Linear4bit)]  # fmt: skip
    assert head == []
    traced(roberta, iterations=1)


@pytest.mark.parametrize(("dtype", "said"), [(None, True), ("fp32", True), ("bf16", False)])
def test_no_kbit_prepare_without_16_bit_parameters_is_said(
    tmp_path: Path, dtype: str | None, said: bool
) -> None:
    """Over an fp32 load, kbit preparation casts nothing, so skipping it changed nothing and
    was not said."""
    dtype_flag = ["--dtype", dtype] if dtype else []
    done = cli("symtrace", "--model", LLAMA, "--batch-size", "1", "--seq-len", "8", "--steps",
               "1", "--qlora", "--amp", "bf16", "--no-kbit-prepare", *dtype_flag,
               "--out", str(tmp_path / "t.jsonl"))  # fmt: skip
    assert ("--no-kbit-prepare has no effect" in done.stderr) == said, done.stderr


def test_qlora_dequantizes_a_transient_weight_per_layer() -> None:
    w = workload(dtype="bf16", qlora=True, lora=Lora(8))
    rec, _ = trace(w, StepConfig("adamw", 1), load_profile(None))
    q_proj = 128 * 128 * 2  # one dequantized bf16 q_proj weight
    sizes = [e["size"] for e in rec.events if e["kind"] == "alloc"]
    # forward and backward each dequantize every 4-bit layer: 2 q_proj-sized weights per layer
    # (q_proj and o_proj share the shape).
    assert sizes.count(q_proj) >= 2 * 2 * 2


@pytest.mark.parametrize(
    ("regime", "expect"),
    [
        ({"dtype": "bf16", "amp": "fp16"}, "contradictory"),
        ({"dtype": "fp16", "amp": "bf16"}, "contradictory"),
        ({"dtype": "fp8"}, "expected one of"),
        ({"double_quant": True}, "without --qlora"),
    ],
)
def test_contradictory_regimes_are_refused(regime: dict[str, Any], expect: str) -> None:
    with pytest.raises(UserError, match=expect):
        Regime(**regime).validate()


def test_lora_targets_that_match_nothing_list_the_modules() -> None:
    with pytest.raises(UserError, match=r"foo matches no module.*q_proj.*v_proj"):
        workload(lora=Lora(8, targets=("foo", "q_proj")))


@pytest.mark.parametrize(
    ("text", "targets", "dropout", "expect"),
    [("0", None, None, "positive"), ("a:b", None, None, "R or R:ALPHA"),
     ("8", " , ", None, "module names"), ("8", None, 1.0, "probability")],
)  # fmt: skip
def test_bad_lora_flags(text: str, targets: str | None, dropout: float | None, expect: str) -> None:
    with pytest.raises(UserError, match=expect):
        Lora.parse(text, targets, dropout)


def test_peft_and_transformers_say_nothing_of_memtraces_own_calls() -> None:
    """peft's and transformers' warnings about the calls memtrace makes (a deprecated attribute
    peft reads, the LoraConfig memtrace builds, GPT-2's class name that maps to no loss) reached
    the user, three times per Python estimate; memtrace's own warnings still do."""
    import warnings

    from transformers.loss.loss_utils import LOSS_MAPPING

    from memtrace_trainer import notes

    said: list[str] = []
    with warnings.catch_warnings(record=True) as seen, notes.captured(said.append):
        warnings.simplefilter("always")  # as pytest and notebooks show them
        w = workload("hf:gpt2", batch=1, seq=16, lora=Lora(1024, targets=("c_attn", "lm_head")))
        llama = workload(lora=Lora(8))
    assert [str(x.message) for x in seen] == []
    assert any("the rank reaches the smaller side" in m for m in said)
    # transformers' loss_function logs when loss_type is not one of its losses.
    assert w.model.base_model.model.loss_type in LOSS_MAPPING
    assert llama.model.base_model.model.loss_type == "ForCausalLM"
    # Outside the build, the filters are the caller's again.
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        warnings.warn("`is_gradient_checkpointing` is deprecated", FutureWarning, stacklevel=1)
    assert len(seen) == 1


# --- checkpointing -----------------------------------------------------------------------------


def test_checkpointing_orders_activation_memory() -> None:
    peaks = {}
    for mode in (None, "selective", "full"):
        _, _, peaks[mode] = traced(workload(dtype="bf16", seq=128), checkpointing=mode)
    assert peaks["full"] < peaks["selective"] < peaks[None]


def test_checkpointing_a_hf_model_draws_no_message_from_transformers(capfd: Any) -> None:
    """transformers said "`use_cache=True` is incompatible with gradient checkpointing" at the
    first training forward: a message about memtrace's own call. The cache is off up front, as
    transformers would turn it off there."""
    import logging

    w = workload(dtype="bf16", seq=128)
    # transformers says it once per process (it adds `warning_once` to Logger on import).
    logging.Logger.warning_once.cache_clear()  # type: ignore[attr-defined]
    assert w.model.config.use_cache is True
    traced(w, checkpointing="full")
    assert w.model.config.use_cache is False
    assert "use_cache" not in capfd.readouterr().err


def test_checkpointing_of_a_peft_model_reaches_the_base() -> None:
    none = traced(workload(dtype="bf16", lora=Lora(8), seq=128))[2]
    full = traced(workload(dtype="bf16", lora=Lora(8), seq=128), checkpointing="full")[2]
    assert full < none


@pytest.mark.parametrize("mode", ["full", "selective"])
def test_checkpointing_a_flat_model_is_said_to_save_little(tmp_path: Path, mode: str) -> None:
    """A flat MLP has only single layers to checkpoint, which saves little (each keeps its
    input): the flag was accepted in silence. It is still run as asked, and recorded so."""
    from conftest import read_trace

    mlp = 'synthetic:{"family":"mlp","input_size":64,"output_size":10,"depth":3}'
    out = tmp_path / "t.jsonl"
    done = cli("symtrace", "--model", mlp, "--batch-size", "8", "--steps", "1",
               "--checkpointing", mode, "--out", str(out))  # fmt: skip
    assert f"--checkpointing {mode} saves little on this model" in done.stderr
    assert read_trace(out)[0]["metadata"]["checkpointing"] == mode
    done = cli("estimate", "--model", mlp, "--batch-size", "8", "--steps", "1",
               "--checkpointing", mode, "--json")  # fmt: skip
    answer = json.loads(done.stdout)
    assert any("saves little" in w for w in answer["warnings"])
    # A model with blocks of several layers is checkpointed, and said nothing of.
    done = cli("symtrace", "--model", LLAMA, "--batch-size", "1", "--seq-len", "8", "--steps",
               "1", "--checkpointing", mode, "--out", str(out))  # fmt: skip
    assert "saves little" not in done.stderr
    assert read_trace(out)[0]["metadata"]["checkpointing"] == mode


# --- optimizers --------------------------------------------------------------------------------


def test_adamw_8bit_state_is_a_byte_per_value_plus_block_constants() -> None:
    w = workload(dtype="bf16")
    big = [p.numel() for p in w.model.parameters() if p.numel() >= 4096]
    small = [p.numel() for p in w.model.parameters() if p.numel() < 4096]
    cats, _, _ = traced(w, optimizer="adamw-8bit")
    expect = sum(2 * n + 2 * 4 * -(-n // 256) for n in big) + sum(2 * 4 * n for n in small)
    assert cats["optimizer_state"] == expect + 2 * 256 * 4  # + the two shared quantization maps


def test_paged_optimizer_state_is_reported_outside_the_allocator(capsys: Any) -> None:
    w = workload("hf:gpt2", batch=1, seq=16, dtype="bf16")
    big = sum(p.numel() for p in w.model.parameters() if p.numel() >= 100_000)
    cats, extra, _ = traced(w, optimizer="paged-adamw-8bit", iterations=1)
    assert extra["paged_optimizer_bytes"] == 2 * big
    assert cats["optimizer_state"] < 2 * big / 10


def test_paged_optimizer_state_under_fsdp2_is_the_ranks_shard() -> None:
    """Each rank pages the state of its own shard: rank 0 holds the largest dim-0 chunk. Before,
    every rank was said to page the whole model's state (the DTensor's global size)."""
    world = 4
    w = workload("hf:gpt2", batch=1, seq=16, dtype="bf16")
    local = [-(-p.shape[0] // world) * (p.numel() // p.shape[0]) for p in w.model.parameters()]
    big = sum(n for n in local if n >= 100_000)
    _, extra, _ = traced(w, optimizer="paged-adamw", iterations=1, strategy="fsdp2",
                         world_size=world)  # fmt: skip
    assert extra["paged_optimizer_bytes"] == 2 * 4 * big  # two fp32 states per element


def test_adafactor_runs_as_transformers_wrote_it() -> None:
    cats, _, _ = traced(workload(dtype="bf16"), optimizer="adafactor")
    assert 0 < cats["optimizer_state"] < 2 * 2 * workload(dtype="bf16").details["parameters"]


# --- attention ---------------------------------------------------------------------------------


def _qkv(heads: int = 8, kv: int = 8, d: int = 64, dtype: torch.dtype = torch.bfloat16) -> Any:
    q = torch.empty(2, heads, 128, d, device="meta", dtype=dtype, requires_grad=True)
    k = torch.empty(2, kv, 128, d, device="meta", dtype=dtype, requires_grad=True)
    return q, k, torch.empty_like(k)


@pytest.mark.parametrize(
    ("case", "cc", "expect"),
    [
        ({}, (8, 0), "flash"),
        ({"kv": 2}, (8, 0), "flash"),  # grouped-query attention runs in flash since 2.5
        ({"mask": True}, (8, 0), "efficient"),
        ({"dtype": torch.float32}, (8, 0), "efficient"),
        ({"d": 264}, (8, 0), "efficient"),  # flash takes head_dim <= 256
        ({"d": 224}, (8, 6), "efficient"),  # sm86: flash backward refuses head_dim > 192
        ({"dtype": torch.float16}, (7, 5), "efficient"),  # flash needs sm80
        ({}, (7, 5), "math"),  # bf16 efficient needs sm80
        # a mask rules flash out, and efficient needs head_dim % 8 in half precision on sm80
        ({"d": 62, "mask": True}, (8, 0), "math"),
    ],
)
def test_sdpa_backend_follows_pytorch(
    case: dict[str, Any], cc: tuple[int, int], expect: str
) -> None:
    q, k, v = _qkv(case.get("heads", 8), case.get("kv", 8), case.get("d", 64),
                   case.get("dtype", torch.bfloat16))  # fmt: skip
    mask = (
        torch.empty(2, 1, 128, 128, device="meta", dtype=torch.bool) if case.get("mask") else None
    )
    profile = dataclasses.replace(load_profile(None), compute_capability=cc)
    assert sdpa_backend(q, k, v, mask, False, profile) == expect


@pytest.mark.parametrize(
    ("backends", "priority", "mask", "expect"),
    [
        (["MATH"], False, False, "math"),
        (["EFFICIENT_ATTENTION"], False, False, "efficient"),
        (["EFFICIENT_ATTENTION", "MATH"], False, True, "efficient"),
        (["MATH", "FLASH_ATTENTION"], True, False, "math"),  # the program's own order
        (["FLASH_ATTENTION", "MATH"], True, False, "flash"),
        (["FLASH_ATTENTION"], False, True, None),  # a mask: flash refuses, nothing else is on
    ],
)
def test_sdpa_backend_takes_the_kernels_the_program_left_on(
    backends: list[str], priority: bool, mask: bool, expect: str | None
) -> None:
    from torch.nn.attention import SDPBackend, sdpa_kernel

    q, k, v = _qkv()
    m = torch.empty(2, 1, 128, 128, device="meta", dtype=torch.bool) if mask else None
    profile = load_profile(None)
    with sdpa_kernel([getattr(SDPBackend, b) for b in backends], set_priority=priority):
        if expect is None:
            with pytest.raises(RuntimeError, match="No available kernel"):
                sdpa_backend(q, k, v, m, False, profile)
        else:
            assert sdpa_backend(q, k, v, m, False, profile) == expect
    assert sdpa_backend(q, k, v, None, False, profile) == "flash"  # the context undone
    torch.backends.cuda.enable_flash_sdp(False)
    try:
        assert sdpa_backend(q, k, v, None, False, profile) == "efficient"
    finally:
        torch.backends.cuda.enable_flash_sdp(True)


def test_flash_attention_2_forces_flash_and_needs_half_precision() -> None:
    _, extra, _ = traced(workload(dtype="bf16", attn="flash_attention_2"))
    assert set(extra["sdpa_backends"]) == {"flash"}
    with pytest.raises(UserError, match="flash_attention_2 runs only in fp16/bf16"):
        traced(workload(attn="flash_attention_2"))
    # A model transformers refuses it for (T5: its position bias is a mask flash cannot take)
    # was estimated as a job that cannot start.
    with pytest.raises(UserError, match="transformers does not support it for T5"):
        workload(T5, dtype="bf16", attn="flash_attention_2")


@pytest.mark.parametrize(
    ("regime", "step"),
    [({}, {"amp": "bf16"}), ({"dtype": "bf16", "qlora": True, "lora": Lora(8)}, {})],
)
def test_flash_attention_2_casts_fp32_inputs_as_transformers_does(regime: dict, step: dict) -> None:
    """The HF Trainer's bf16=True over fp32 weights, and QLoRA (whose norms prepare casts to
    fp32): RoPE hands flash attention fp32 q and k, which transformers' integration casts to the
    autocast dtype, or to a quantized model's load dtype. Both were refused, the message asking
    for the --amp bf16 already given."""
    _, extra, _ = traced(workload(attn="flash_attention_2", **regime), **step)
    assert set(extra["sdpa_backends"]) == {"flash"}


def test_causal_lm_loss_upcasts_logits_to_fp32() -> None:
    w = workload(dtype="bf16", batch=2, seq=64)
    rec, _ = trace(w, StepConfig("adamw", 1), load_profile(None))
    fp32_logits = 2 * 64 * 1000 * 4
    assert any(e["kind"] == "alloc" and e["size"] == fp32_logits for e in rec.events)


# --- the command line ----------------------------------------------------------------------------


def test_estimate_json_carries_the_regime_and_model_state_baselines() -> None:
    done = cli("estimate", "--model", LLAMA, "--batch-size", "2", "--seq-len", "64", "--dtype",
               "bf16", "--lora", "8", "--optimizer", "adamw", "--memtracker", "--json")  # fmt: skip
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    sym = out["estimates"]["symbolic"]
    for key in ("device_mib", "reserved_mib", "allocated_mib"):
        assert isinstance(sym[key], float)
    details = out["inputs"]["model_details"]
    assert 0 < details["trainable_parameters"] < details["parameters"]
    for name in ("accelerate", "deepspeed", "memtracker"):
        assert out["estimates"][name]["role"] == "baseline", name
        assert out["estimates"][name]["ignores"]
    params = details["parameters"]
    assert out["estimates"]["deepspeed"]["device_mib"] == pytest.approx(20 * params / 2**20)
    assert out["estimates"]["accelerate"]["device_mib"] == pytest.approx(4 * 2 * params / 2**20)


def test_memtracker_agrees_with_the_plain_trace_on_live_bytes() -> None:
    """PyTorch's MemTracker and memtrace's recorder count the same live tensors of the same
    steps: the peaks agree within MemTracker's 512-byte storage rounding plus 2%."""
    from memtrace_trainer.baselines import memtracker
    from memtrace_trainer.symtrace.tracer import trace as run_trace

    for regime in ({"dtype": "bf16"}, {"dtype": "bf16", "lora": Lora(8)}):
        seen: dict[str, int] = {}

        def run(regime: dict[str, Any] = regime, seen: dict[str, int] = seen) -> None:
            rec, _ = run_trace(workload(**regime), StepConfig("adamw", 2, cuda_emulation=False),
                               load_profile(None))  # fmt: skip
            seen["peak"] = summarize(rec.events).peak_live_bytes

        tracked = memtracker(run)["device_mib"] * 2**20
        assert abs(tracked - seen["peak"]) / seen["peak"] < 0.02, (regime, tracked, seen)


def test_bad_flags_exit_2_with_the_reason() -> None:
    for args, expect in (
        (["--dtype", "bf16", "--amp", "fp16"], "contradictory"),
        (["--lora-targets", "q_proj"], "needs --lora R"),
        (["--lora", "8", "--lora-targets", "nope"], "nope matches no module"),
        (["--lora", "8", "--lora-targets", "all-linear,q_proj"], "give it alone"),
        (["--lora", "8", "--lora-targets", "q_proj,,"], "expected module names"),
        (["--qlora-double-quant"], "without --qlora"),
    ):
        done = cli(
            "estimate", "--model", LLAMA, "--batch-size", "1", "--seq-len", "16", *args, check=False
        )
        assert done.returncode == 2 and expect in done.stderr, (args, done.stderr)


def test_task_and_attn_warn_on_models_they_do_not_shape(tmp_path: Path) -> None:
    done = cli("symtrace", "--model", "torchvision:resnet18", "--batch-size", "1", "--task",
               "causal-lm", "--out", str(tmp_path / "t.jsonl"), "--no-cuda-emulation")  # fmt: skip
    assert done.returncode == 0 and "--task causal-lm has no effect" in done.stderr


def test_max_seq_fits_by_estimate_and_the_next_step_does_not(tmp_path: Path) -> None:
    # tiny-llama with room for long sequences (its own table has 256 positions).
    config = json.loads((CONFIGS / "tiny-llama.json").read_text())
    (tmp_path / "long.json").write_text(json.dumps(config | {"max_position_embeddings": 32768}))
    long = f"hf-config:{tmp_path / 'long.json'}"
    args = ["--model", long, "--dtype", "bf16", "--profile", "a100-40gb", "--capacity", "1600MiB",
            "--multiple-of", "256", "--limit", "16384"]  # fmt: skip
    done = cli("max-seq", *args, "--json")
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    best = out["max_seq_len"]
    assert best % 256 == 0 and 0 < best < 16384
    probes = {p["seq_len"]: p["fits"] for p in out["probes"]}
    assert probes[best] and not probes[best + 256]
    est = cli("estimate", "--model", long, "--batch-size", "1", "--seq-len", str(best), "--dtype",
              "bf16", "--capacity", "1600MiB")  # fmt: skip
    assert est.returncode == 0, est.stderr


def test_max_seq_answers_no_longer_than_the_model_takes() -> None:
    done = cli("max-seq", "--model", LLAMA, "--capacity", "40GiB", "--json")
    out = json.loads(done.stdout)
    assert out["max_seq_len"] == 256 and "max_position_embeddings" in out["limit_why"], out
    assert not [w for w in out["warnings"] if "--limit" in w], out["warnings"]
    # A --limit past the positions was taken silently, where --multiple-of past them is refused.
    done = cli("max-seq", "--model", LLAMA, "--capacity", "40GiB", "--limit", "1000", "--json")
    out = json.loads(done.stdout)
    assert out["max_seq_len"] == 256, out
    assert (f"--limit 1000 is beyond {LLAMA}'s max_position_embeddings (256): a real run takes "
            "no longer sequence, so the search stops at 256") in out["warnings"], out  # fmt: skip
    # Where the capacity, not the positions, ends the search, the positions are no reason.
    done = cli("max-seq", "--model", LLAMA, "--capacity", "1470MiB", "--json")
    out = json.loads(done.stdout)
    assert out["max_seq_len"] < 256 and out["limit_why"] is None, out
    image = cli("max-seq", "--model", "torchvision:resnet18", check=False)
    assert image.returncode == 2 and "takes no token sequence" in image.stderr


def test_hf_models_lists_every_known_id() -> None:
    done = cli("hf-models", "--json")
    assert done.returncode == 0
    rows = [json.loads(line) for line in done.stdout.splitlines()]
    assert [r["id"] for r in rows] == hf.known_ids()
    assert {"llama", "mistral", "qwen2", "gemma", "phi3", "falcon", "gpt2", "bert", "t5"} <= {
        r["model_type"] for r in rows
    }


def _families() -> dict[str, str]:
    first: dict[str, str] = {}
    for repo_id in hf.known_ids():
        first.setdefault(hf.resolve(repo_id).config["model_type"], repo_id)
    return first


# peft has no default LoRA targets for these: the test names them, as a user must.
TARGETS = {"mixtral": ("q_proj", "v_proj"), "phi3": ("qkv_proj",)}


@pytest.mark.parametrize(("model_type", "repo_id"), sorted(_families().items()))
def test_every_family_trains_with_lora_and_checkpointing(
    tmp_path: Path, model_type: str, repo_id: str
) -> None:
    """Each family in the registry, cut to one layer, through the tracer with LoRA and full
    checkpointing in pure bf16: its own attention, loss and checkpointing code runs."""
    config = dict(hf.resolve(repo_id).config)
    for key in ("num_hidden_layers", "n_layer", "num_layers", "num_decoder_layers"):
        if key in config:
            config[key] = 1
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    w = workload(
        f"hf-config:{path}", 1, 32, dtype="bf16", lora=Lora(8, targets=TARGETS.get(model_type))
    )
    assert 0 < w.details["trainable_parameters"] < w.details["parameters"] / 10
    trainable = [p for p in w.model.parameters() if p.requires_grad]
    cats, _, _ = traced(w, checkpointing="full")
    # AdamW's two moments in each trainable parameter's dtype: fp32 adapters, and for
    # classifiers peft's trainable copy of the head (modules_to_save) in the model's bf16.
    assert cats["optimizer_state"] == sum(2 * p.numel() * p.element_size() for p in trainable)


def test_qlora_without_lora_takes_peft_default_rank_and_says_so() -> None:
    from memtrace_trainer.cli.common import tune_from

    tune = tune_from({"qlora": True, "amp": "bf16"})
    w = build_workload(LLAMA, 1, seq_len=8, tune=tune)
    assert w.defaults["lora"]["value"] == 8
    assert 0 < w.details["trainable_parameters"] < w.details["parameters"]


def test_num_classes_on_a_token_task_is_warned_about(tmp_path: Path) -> None:
    done = cli("symtrace", "--model", LLAMA, "--batch-size", "1", "--seq-len", "8",
               "--num-classes", "5", "--out", str(tmp_path / "t.jsonl"))  # fmt: skip
    assert "--num-classes 5 has no effect: --task causal-lm" in done.stderr


def test_a_sequence_beyond_the_models_positions_is_warned_about(tmp_path: Path) -> None:
    # The meta device does not check the position lookup a real run fails at.
    def err(seq: int) -> str:
        out = tmp_path / "t.jsonl"
        done = cli("symtrace", "--model", LLAMA, "--batch-size", "1", "--seq-len", str(seq),
                   "--steps", "1", "--out", str(out))  # fmt: skip
        return done.stderr

    said = err(512)
    assert "a sequence of 512 tokens is beyond" in said
    assert "tiny-llama.json's max_position_embeddings (256)" in said
    assert "rotary or relative" in said
    assert "beyond" not in err(256)


def test_a_sequence_beyond_learned_positions_is_refused(tmp_path: Path) -> None:
    """GPT-2 learns a table of n_positions rows: a longer sequence fails at its lookup on a
    real run, so it is no job to estimate (it was warned about, and judged FITS)."""
    config = tmp_path / "gpt2.json"
    config.write_text(json.dumps({"model_type": "gpt2", "n_layer": 1, "n_embd": 32, "n_head": 2,
                                  "vocab_size": 100, "n_positions": 64}))  # fmt: skip
    out = tmp_path / "t.jsonl"
    args = ("symtrace", "--model", f"hf-config:{config}", "--batch-size", "1", "--steps", "1",
            "--out", str(out))  # fmt: skip
    done = cli(*args, "--seq-len", "65", check=False)
    assert done.returncode == 2, done.stderr
    assert (
        "--seq-len 65: beyond " in done.stderr
        and "gpt2.json's max_position_embeddings (64)" in done.stderr
    )
    assert "learns its positions (transformer.wpe, 64 rows)" in done.stderr and not out.exists()
    assert cli(*args, "--seq-len", "64").returncode == 0
    # A rotary model whose vocabulary has as many rows as its positions: no table of positions.
    config.write_text(json.dumps({"model_type": "llama", "hidden_size": 64, "intermediate_size": 128,
                                  "num_hidden_layers": 1, "num_attention_heads": 2,
                                  "vocab_size": 64, "max_position_embeddings": 64}))  # fmt: skip
    done = cli(*args, "--seq-len", "65")
    assert "positions are computed (rotary or relative)" in done.stderr


@pytest.mark.parametrize(
    ("config", "said"),
    [
        ({"model_type": "gpt2", "n_layer": "two"}, "field n_layer is 'two': expected a positive"),
        ({"model_type": "llama", "hidden_size": 64, "num_attention_heads": 5}, "not a multiple"),
        # Before, these reached PyTorch and were an "internal error, please report it".
        ({"model_type": "llama", "vocab_size": -5}, "field vocab_size is -5"),
        ({"model_type": "llama", "intermediate_size": -1}, "field intermediate_size is -1"),
        ({"model_type": "gpt2", "n_positions": -3}, "field n_positions is -3"),
        ({"model_type": "llama", "num_attention_heads": 0}, "field num_attention_heads is 0"),
        (
            {
                "model_type": "llama",
                "hidden_size": 64,
                "num_attention_heads": 4,
                "num_key_value_heads": 3,
            },
            "num_key_value_heads is 3: expected a divisor",
        ),
    ],
)
def test_a_config_transformers_rejects_is_the_users_error(
    tmp_path: Path, config: dict, said: str
) -> None:
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    done = cli("symtrace", "--model", f"hf-config:{path}", "--batch-size", "1",
               "--out", str(tmp_path / "t.jsonl"), check=False)  # fmt: skip
    assert done.returncode == 2, done.stderr
    assert f"{path}: " in done.stderr and said in done.stderr
    assert "internal error" not in done.stderr


def test_fp16_autocast_over_fp16_trainable_parameters_is_refused(tmp_path: Path) -> None:
    # torch.amp.GradScaler raises "Attempting to unscale FP16 gradients" at the first step.
    def run(*flags: str) -> Any:
        return cli("symtrace", "--model", LLAMA, "--batch-size", "1", "--seq-len", "16",
                   "--steps", "1", "--dtype", "fp16", "--amp", "fp16", *flags,
                   "--out", str(tmp_path / "t.jsonl"), check=False)  # fmt: skip

    full = run()
    assert full.returncode == 2 and "cannot unscale fp16 gradients" in full.stderr, full.stderr
    # LoRA adapters stay fp32 under an fp16 base: the scaler unscales them, as on a GPU.
    assert run("--lora", "8").returncode == 0


def test_the_answer_names_the_fine_tuning_regime() -> None:
    """`estimate --json` (and so `serve`) and `max-batch --json` say what was fine-tuned how: a
    QLoRA answer read as a full fine-tune's before."""
    args = ("--model", LLAMA, "--seq-len", "8", "--steps", "1", "--json")
    tuned = ("--qlora", "--dtype", "bf16", "--lora", "16:32", "--lora-targets", "q_proj")
    est = json.loads(cli("estimate", *args, "--batch-size", "1", *tuned).stdout)
    assert est["inputs"]["fine_tuning"] == {
        "dtype": "bf16", "qlora": True, "double_quant": False, "kbit_prepare": True,
        "bnb_version": "0.50", "lora": {"r": 16, "alpha": 32, "dropout": 0.0, "targets": ["q_proj"]},
    }  # fmt: skip
    full = json.loads(cli("estimate", *args, "--batch-size", "1").stdout)
    assert full["inputs"]["fine_tuning"] == {"dtype": "fp32", "lora": None, "qlora": False}
    found = json.loads(cli("max-batch", *args, *tuned, "--limit", "2", check=False).stdout)
    assert found["inputs"]["fine_tuning"] == est["inputs"]["fine_tuning"]
    assert found["inputs"]["seq_len"] == 8
    sharded = json.loads(cli("max-batch", *args, "--strategy", "fsdp2", "--world-size", "2",
                             "--fsdp-mp", "bf16:fp32", "--attn", "sdpa", "--limit", "1",
                             check=False).stdout)  # fmt: skip
    assert (sharded["inputs"]["fsdp_mp"], sharded["inputs"]["attn"]) == ("bf16:fp32", "sdpa")
