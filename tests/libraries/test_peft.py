"""PEFT (LoRA) models: only the adapter trains, checkpoints hold the adapter, resume and best-model
loading put it back exactly, activation checkpointing works with the frozen base, and the run
equals transformers.Trainer's. A tiny GPT-2 built from its config (no download)."""

import copy
import functools
import os

import pytest
import torch
from tiny import LMDataset, lm_collate, stop_at, tiny_gpt2

peft = pytest.importorskip("peft")
transformers = pytest.importorskip("transformers")

import cadence  # noqa: E402
from cadence import Trainer, TrainingArguments  # noqa: E402


def lora(model=None, seed=3):
    model = model if model is not None else tiny_gpt2(seed=seed)
    model.loss_type = "ForCausalLM"  # transformers then counts the shifted labels as cadence does (test_hf_parity.py)
    config = peft.LoraConfig(task_type="CAUSAL_LM", r=4, lora_alpha=8, lora_dropout=0.0, target_modules=["c_attn"],
                             fan_in_fan_out=True)
    torch.manual_seed(seed)  # lora_A's initialisation
    return peft.get_peft_model(model, config)


def adapter(model):
    return {k: v.detach().clone() for k, v in peft.get_peft_model_state_dict(model).items()}


def base(model):
    return {k: v.detach().clone() for k, v in model.named_parameters() if "lora_" not in k}


COMMON = dict(per_device_train_batch_size=4, gradient_accumulation_steps=2, max_steps=6, learning_rate=1e-2,
              warmup_steps=1, weight_decay=0.01, logging_steps=1, report_to="none", disable_tqdm=True, seed=11,
              use_cpu=True, save_strategy="steps", save_steps=3)


def run(out, model=None, stop=None, resume=None, lib=cadence, **kw):
    model = model if model is not None else lora()
    args = lib.TrainingArguments(output_dir=out, **{**COMMON, **kw})
    extra = {"eval_dataset": LMDataset(8, seed=5)} if kw.get("eval_strategy") else {}
    trainer = lib.Trainer(model=model, args=args, train_dataset=LMDataset(40), data_collator=lm_collate,
                          callbacks=[stop_at(stop)] if stop else [], **extra)
    trainer.train(resume_from_checkpoint=resume)
    return trainer


def test_only_the_adapter_trains_and_the_base_is_unchanged(tmp_path):
    model = lora()
    before_base, before_adapter = base(model), adapter(model)
    trainer = run(str(tmp_path / "run"), model)
    trainable = {id(p) for p in model.parameters() if p.requires_grad}
    in_optimizer = [id(p) for g in trainer.optimizer.param_groups for p in g["params"]]
    assert len(in_optimizer) == len(trainable) == 4 and set(in_optimizer) == trainable  # lora_A/B of 2 layers
    for name, value in base(model).items():
        assert torch.equal(value, before_base[name]), name
    after = adapter(model)
    assert all((after[k] - before_adapter[k]).abs().max() > 1e-4 for k in after)  # every adapter tensor trained


def test_checkpoints_and_save_model_hold_the_adapter_only(tmp_path):
    out = str(tmp_path / "run")
    trainer = run(out)
    trainer.save_model(str(tmp_path / "final"))
    for folder in (os.path.join(out, "checkpoint-3"), os.path.join(out, "checkpoint-6"), str(tmp_path / "final")):
        files = set(os.listdir(folder))
        assert {"adapter_model.safetensors", "adapter_config.json"} <= files, files
        assert not files & {"model.safetensors", "pytorch_model.bin", "model.safetensors.index.json"}
    # read back with peft's own loader onto a fresh base: the trained model, exactly
    loaded = peft.PeftModel.from_pretrained(tiny_gpt2(seed=3), str(tmp_path / "final"))  # the same fresh base
    ours = adapter(trainer.model)
    theirs = adapter(loaded)
    assert ours.keys() == theirs.keys() and all(torch.equal(ours[k], theirs[k]) for k in ours)
    from safetensors.torch import load_file

    stored = load_file(os.path.join(out, "checkpoint-6", "adapter_model.safetensors"))
    assert all("lora_" in k for k in stored) and all(torch.equal(stored[k], ours[k]) for k in ours)


def test_resume_loads_the_adapter_exactly(tmp_path):
    full = run(str(tmp_path / "full"))
    out = str(tmp_path / "run")
    run(out, stop=3)
    resumed = run(out, resume=True)
    a, b = adapter(full.model), adapter(resumed.model)
    assert all(torch.equal(a[k], b[k]) for k in a)
    sa, sb = full.optimizer.state_dict()["state"], resumed.optimizer.state_dict()["state"]
    assert all(torch.equal(sa[i]["exp_avg_sq"], sb[i]["exp_avg_sq"]) for i in sa)
    assert [h["loss"] for h in full.state.log_history if "loss" in h] == \
        [h["loss"] for h in resumed.state.log_history if "loss" in h]
    for name, value in base(resumed.model).items():  # the frozen base is the fresh model's, untouched
        assert torch.equal(value, base(full.model)[name]), name


def test_resume_refuses_a_checkpoint_without_its_adapter(tmp_path):
    out = str(tmp_path / "run")
    run(out, stop=3)
    folder = os.path.join(out, "checkpoint-3")
    os.remove(os.path.join(folder, "adapter_model.safetensors"))
    with pytest.raises(ValueError, match="adapter_model.safetensors"):  # the manifest names the missing file
        run(out, resume=folder)
    for name in ("checkpoint_manifest.json", "loop_state.json"):  # a checkpoint without checksums (transformers')
        os.remove(os.path.join(folder, name))
    with pytest.raises(FileNotFoundError, match="no adapter_model.safetensors for adapter 'default'"):
        run(out, resume=folder)


def test_same_adapter_as_transformers(tmp_path):
    model = lora()
    hf = run(str(tmp_path / "hf"), copy.deepcopy(model), lib=transformers, save_strategy="no")
    cd = run(str(tmp_path / "cd"), copy.deepcopy(model), save_strategy="no")
    theirs, ours = adapter(hf.model), adapter(cd.model)
    # float32 sums in another order (the two loops group the same additions differently) differ in the
    # last bits; over 6 AdamW steps of lr 1e-2 that stays far below 1e-5 (test_hf_parity.py: the same bound)
    for k in ours:
        assert torch.allclose(ours[k], theirs[k], atol=1e-5, rtol=1e-4), k
    assert max((theirs[k] - adapter(model)[k]).abs().max().item() for k in theirs) > 1e-3  # the adapter moved
    hf_losses = [h["loss"] for h in hf.state.log_history if "loss" in h]
    cd_losses = [h["loss"] for h in cd.state.log_history if "loss" in h]
    assert cd_losses == pytest.approx(hf_losses, rel=1e-5)


def test_load_best_model_at_end_loads_the_best_adapter(tmp_path):
    out = str(tmp_path / "run")
    # greater_is_better on the loss makes an early checkpoint the best, so loading it changes the model
    trainer = run(out, eval_strategy="steps", eval_steps=3, load_best_model_at_end=True, metric_for_best_model="loss",
                  greater_is_better=True, max_steps=9)
    best = trainer.state.best_model_checkpoint
    assert best is not None and best.endswith("checkpoint-3")
    from safetensors.torch import load_file

    stored = load_file(os.path.join(best, "adapter_model.safetensors"))
    last = load_file(os.path.join(out, "checkpoint-9", "adapter_model.safetensors"))
    ours = adapter(trainer.model)
    assert all(torch.equal(ours[k], stored[k]) for k in ours)
    assert any(not torch.equal(ours[k], last[k]) for k in ours)


class OldStyleGPT2(transformers.GPT2LMHeadModel):
    """A GPT-2 whose enable method only switches checkpointing on (reentrant), as transformers 4.x did:
    it does not make the frozen embeddings' output require grad; cadence must."""

    def activation_checkpointing_enable(self, activation_checkpointing_kwargs=None):
        from torch.utils.checkpoint import checkpoint

        kwargs = activation_checkpointing_kwargs or {"use_reentrant": True}
        self._set_gradient_checkpointing(enable=True, gradient_checkpointing_func=functools.partial(checkpoint, **kwargs))


def old_style(seed=3):
    torch.manual_seed(seed)
    return OldStyleGPT2(tiny_gpt2(seed=seed).config)


@pytest.mark.parametrize("make", [tiny_gpt2, old_style])
def test_activation_checkpointing_with_a_frozen_base(tmp_path, make):
    """Reentrant checkpointing needs inputs that require grad, which a frozen embedding does not give."""
    plain = run(str(tmp_path / "plain"), lora(make(seed=3)), save_strategy="no")
    kwargs = {"use_reentrant": True}
    checkpointed = run(str(tmp_path / "ckpt"), lora(make(seed=3)), save_strategy="no", activation_checkpointing=True,
                       activation_checkpointing_kwargs=kwargs)
    start = adapter(lora(make(seed=3)))
    ours, reference = adapter(checkpointed.model), adapter(plain.model)
    for k in ours:
        assert (ours[k] - start[k]).abs().max() > 1e-4, k  # every layer's adapter got gradients
        # recomputing the same forward gives the same numbers on the CPU; 1e-6 leaves room for kernel choice
        assert torch.allclose(ours[k], reference[k], atol=1e-6), k


def test_purely_quantized_model_is_refused(tmp_path):
    args = TrainingArguments(output_dir=str(tmp_path), report_to="none", disable_tqdm=True, max_steps=1)
    for flag in ("is_loaded_in_4bit", "is_loaded_in_8bit", "is_quantized"):
        model = tiny_gpt2()
        setattr(model, flag, True)  # what transformers sets on a bitsandbytes 4/8-bit model
        with pytest.raises(ValueError, match="purely quantized.*attach trainable adapters"):
            Trainer(model, args, train_dataset=LMDataset(8), data_collator=lm_collate)
    model = tiny_gpt2()
    model.is_loaded_in_4bit = True
    Trainer(lora(model), args, train_dataset=LMDataset(8), data_collator=lm_collate)  # with an adapter: accepted


def test_cadence_resumes_a_transformers_lora_checkpoint(tmp_path):
    """transformers writes the same adapter files: cadence resumes its checkpoint and ends where it ends."""
    model = lora()
    hf = run(str(tmp_path / "hf"), copy.deepcopy(model), lib=transformers)  # saves checkpoint-3 and -6
    cd = run(str(tmp_path / "cd"), copy.deepcopy(model), resume=str(tmp_path / "hf" / "checkpoint-3"))
    theirs, ours = adapter(hf.model), adapter(cd.model)
    for k in ours:  # the same tolerance as the unbroken parity above (3 steps on each side of the checkpoint)
        assert torch.allclose(ours[k], theirs[k], atol=1e-5, rtol=1e-4), k


def two_adapters(seed=3):
    """LoRA adapters "default" (active: trains) and "second" (frozen; lora_B filled with 0.25, unlike a fresh one's
    zeros), so that each adapter's saved tensors differ from the other's and from a fresh model's."""
    model = lora(seed=seed)
    model.add_adapter("second", peft.LoraConfig(task_type="CAUSAL_LM", r=4, lora_alpha=8, lora_dropout=0.0,
                                                target_modules=["c_attn"], fan_in_fan_out=True))
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B.second" in name:
                p.fill_(0.25)
    return model


def named_adapter(model, name):
    return {k: v.detach().clone() for k, v in peft.get_peft_model_state_dict(model, adapter_name=name).items()}


def test_resume_restores_each_adapter_of_a_multi_adapter_model_into_its_own_name(tmp_path):
    full = run(str(tmp_path / "full"), two_adapters())
    out = str(tmp_path / "run")
    run(out, two_adapters(), stop=3)
    assert os.path.isfile(os.path.join(out, "checkpoint-3", "second", "adapter_model.safetensors"))
    resumed = run(out, two_adapters(), resume=True)
    for name in ("default", "second"):
        a, b = named_adapter(full.model, name), named_adapter(resumed.model, name)
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a), name
    # independent reference: "second" never trained (not active), so it is its 0.25-filled lora_B, and "default" trained
    second, default = named_adapter(resumed.model, "second"), named_adapter(resumed.model, "default")
    assert all(torch.all(v == 0.25) for k, v in second.items() if "lora_B" in k)
    assert all(v.abs().max() > 1e-4 for k, v in default.items() if "lora_B" in k)  # trained away from its zeros
