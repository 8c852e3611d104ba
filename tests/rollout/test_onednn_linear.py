"""Training passes with the large linear layers on oneDNN: values and all three gradients against torch's
linear, which layers and calls take it and which keep torch's, and a GRPO step that ends where the plain
one does."""

from __future__ import annotations

import pytest
import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

import rlhfkit.core.onednn_products as onednn_products
import rlhfkit.rollout.packed_linear as packed_linear
from rlhfkit.rollout.onednn_linear import OneDNNLinear, onednn_linears

pytestmark = pytest.mark.skipif(not torch.backends.mkldnn.is_available(), reason="torch built without oneDNN")


def _relative_error(got: torch.Tensor, expected: torch.Tensor) -> float:
    return ((got - expected).abs().max() / expected.abs().max()).item()


@pytest.mark.parametrize("rows", [300, 1030])  # the weight gradient on torch's product, then on oneDNN's
@pytest.mark.parametrize("with_bias", [True, False])
def test_values_and_gradients_match_torchs_linear(rows, with_bias):
    torch.manual_seed(0)
    layer = torch.nn.Linear(512, 1024, bias=with_bias)  # 2^19 weights, as large as `packable` takes
    x = torch.randn(2, rows // 2, 512, requires_grad=True)
    grad_out = torch.randn(2, rows // 2, 1024)
    params = [x, layer.weight] + ([layer.bias] if with_bias else [])
    got = OneDNNLinear.apply(x, layer.weight, layer.bias)
    expected = torch.nn.functional.linear(x, layer.weight, layer.bias)
    assert got.shape == expected.shape == (2, rows // 2, 1024)
    assert _relative_error(got, expected) < 1e-5
    got_grads = torch.autograd.grad(got, params, grad_out)
    expected_grads = torch.autograd.grad(expected, params, grad_out)
    for name, g, e in zip(["input", "weight", "bias"], got_grads, expected_grads):
        assert g.shape == e.shape and g.layout == torch.strided, name
        assert _relative_error(g, e) < 1e-5, name


def test_frozen_weight_gets_no_gradient_and_the_input_still_does():
    torch.manual_seed(0)
    layer = torch.nn.Linear(512, 1024).requires_grad_(False)  # a PEFT base layer or the reference
    x = torch.randn(300, 512, requires_grad=True)
    out = OneDNNLinear.apply(x, layer.weight, layer.bias)
    (grad_x,) = torch.autograd.grad(out.square().sum(), [x])
    (expected,) = torch.autograd.grad(
        torch.nn.functional.linear(x, layer.weight, layer.bias).square().sum(), [x]
    )
    assert _relative_error(grad_x, expected) < 1e-5


def _model(**overrides):
    # MLP 1,024 x 512, 512 x 1,024 and attention 512 x 512 (2^18 weights: left alone); a 1,024 x 512 head
    config = Qwen2Config(vocab_size=1024, hidden_size=512, intermediate_size=1024, num_hidden_layers=2,
                         num_attention_heads=8, num_key_value_heads=1, tie_word_embeddings=False)  # fmt: skip
    torch.manual_seed(0)
    return Qwen2ForCausalLM(config)


def _kind(output: torch.Tensor) -> str:
    return type(output.grad_fn).__name__


def test_large_layers_take_onednn_for_enough_rows_and_are_restored():
    model = _model()
    up, q_proj = model.model.layers[0].mlp.up_proj, model.model.layers[0].self_attn.q_proj
    many, few = torch.randn(4, 70, 512), torch.randn(2, 8, 512)  # 280 rows, and 16 (< ONEDNN_MIN_ROWS)
    with onednn_linears(model) as count:
        assert count == 2 * 3 + 1  # gate, up and down of each layer, and the head
        assert _kind(up(many)) == "OneDNNLinearBackward"
        assert _kind(up(few)) != "OneDNNLinearBackward"  # few rows: torch's linear
        assert _kind(q_proj(many)) != "OneDNNLinearBackward"  # a small layer: never converted
        with torch.autocast("cpu", dtype=torch.bfloat16):
            assert up(many).dtype == torch.bfloat16  # autocast keeps torch's (bfloat16) linear
        with torch.no_grad():
            torch.testing.assert_close(up(many), torch.nn.functional.linear(many, up.weight, up.bias))
    assert not any("forward" in m.__dict__ for m in model.modules())  # the class's own forward again
    assert _kind(up(many)) != "OneDNNLinearBackward"


def test_layers_that_must_keep_torchs_linear():
    model = _model()
    model.gradient_checkpointing_enable()  # backward replays the forwards outside the block
    with onednn_linears(model) as count:
        assert count == 0
    bf16 = _model().to(torch.bfloat16)  # torch's bfloat16 linear is oneDNN's already
    with onednn_linears(bf16) as count:
        assert count == 0
    with onednn_linears(torch.compile(_model())) as count:  # compiled: patched forwards would be traced
        assert count == 0
    sharded = _model()
    sharded.model.layers[0].mlp.up_proj.weight.ds_id = 7  # a ZeRO-3 shard
    with onednn_linears(sharded) as count:
        assert count == 2 * 3


def test_a_lora_policy_runs_its_base_layers_on_onednn_with_the_same_gradients():
    from peft import LoraConfig, get_peft_model

    def loss_and_grads(model, enabled):
        model.zero_grad()
        query, responses = torch.randint(1, 1024, (4, 12)), torch.randint(1, 1024, (4, 10))
        with onednn_linears(model) if enabled else torch.enable_grad():
            logprobs = model(input_ids=torch.cat([query, responses], 1)).logits.log_softmax(-1)[:, -11:-1]
        logprobs.gather(-1, responses[..., None]).sum().backward()
        return {n: p.grad.clone() for n, p in model.named_parameters() if p.requires_grad}

    model = get_peft_model(
        _model(), LoraConfig(r=4, target_modules=["up_proj", "q_proj"], init_lora_weights=False)
    )
    with onednn_linears(model) as count:
        assert count == 2 * 3 + 1  # up_proj's base layers among them; q_proj's base is too small
    torch.manual_seed(1)
    got = loss_and_grads(model, enabled=True)
    torch.manual_seed(1)
    expected = loss_and_grads(model, enabled=False)
    assert got.keys() == expected.keys() and all("lora_" in n for n in got)
    for name in got:
        assert _relative_error(got[name], expected[name]) < 1e-4, name


def test_a_grpo_step_ends_where_torchs_linear_takes_it(tmp_path, monkeypatch):
    from rlhfkit.tasks import toy_prompt_dataset
    from rlhfkit.testing import tiny_model, tiny_tokenizer
    from rlhfkit.trainers.grpo.config import GRPOConfig
    from rlhfkit.trainers.grpo.trainer import GRPOTrainer

    # every layer of the tiny Llama counts as large here, and every call and product takes oneDNN
    monkeypatch.setattr(packed_linear, "PACK_MIN_ELEMENTS", 1)
    monkeypatch.setattr(packed_linear, "PACK_MIN_INPUTS", 1)
    monkeypatch.setattr(onednn_products, "WEIGHT_GRAD_MIN_ROWS", 1)
    monkeypatch.setattr(onednn_products, "ONEDNN_MIN_INPUTS", 1)
    calls = []
    apply = OneDNNLinear.apply
    monkeypatch.setattr(OneDNNLinear, "apply", lambda *args: calls.append(1) or apply(*args))

    def trained(min_rows: int) -> dict[str, torch.Tensor]:
        monkeypatch.setattr(onednn_products, "ONEDNN_MIN_ROWS", min_rows)
        model = tiny_model("llama")
        args = GRPOConfig(output_dir=str(tmp_path / "out"), report_to="none", use_cpu=True, optim="sgd",
                          per_device_train_batch_size=8, num_generations=4, max_completion_length=5,
                          max_steps=1, save_strategy="no", disable_tqdm=True, seed=3, learning_rate=0.1,
                          beta=0.1)  # fmt: skip
        trainer = GRPOTrainer(
            model,
            lambda completions, **kw: [float(c.count("e")) for c in completions],
            args=args,
            train_dataset=toy_prompt_dataset(n=8),
            processing_class=tiny_tokenizer(padding_side="left"),
        )
        trainer.train()
        return {n: p.detach().clone() for n, p in model.named_parameters()}

    plain = trained(min_rows=10**9)
    assert not calls
    fast = trained(min_rows=1)
    assert calls  # the reference pass, the policy's forward and its backward went through oneDNN
    start = {n: p.detach() for n, p in tiny_model("llama").named_parameters()}
    assert any(not torch.equal(start[n], plain[n]) for n in plain)  # the step moved the policy
    for name in plain:
        torch.testing.assert_close(fast[name], plain[name], rtol=1e-4, atol=1e-5, msg=name)
