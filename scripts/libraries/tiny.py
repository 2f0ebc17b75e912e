"""Tiny models, tokenizers and data built in the process: the matrix downloads nothing (no Hub). The main suite's
TRL worker (tests/workers/trl_worker.py) builds its models and data here too (loaded by path: tests/tiny.py is its ``tiny``)."""

from __future__ import annotations

import os

WORDS = ("the cat dog sat ran on a mat red blue big small fast slow sun moon tree sky sea hill bird fish "
         "yes no good bad why how what who").split()
SPECIALS = ["<pad>", "<unk>", "<s>", "</s>", "<|user|>", "<|assistant|>", "<|system|>", "[CLS]", "[SEP]", "[MASK]"]
CHAT_TEMPLATE = ("{% for m in messages %}{{ '<|' + m['role'] + '|> ' + m['content'] + ' </s> ' }}{% endfor %}"
                 "{% if add_generation_prompt %}{{ '<|assistant|> ' }}{% endif %}")


def tokenizer(padding_side: str = "right", specials: list[str] = SPECIALS):
    """A word-level fast tokenizer over ``specials`` + WORDS, with a chat template set by hand (the BERT tokens
    [CLS]/[SEP]/[MASK] are set when ``specials`` holds them; the tests' TRL worker takes the first 7 only)."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {w: i for i, w in enumerate(specials + WORDS)}
    core = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    bert = {k: t for k, t in (("cls_token", "[CLS]"), ("sep_token", "[SEP]"), ("mask_token", "[MASK]")) if t in vocab}
    tok = PreTrainedTokenizerFast(tokenizer_object=core, pad_token="<pad>", unk_token="<unk>", bos_token="<s>",
                                  eos_token="</s>", padding_side=padding_side, **bert)
    tok.chat_template = CHAT_TEMPLATE
    return tok


def byte_level_tokenizer():
    """A ByteLevel BPE tokenizer trained here on WORDS' sentences (for trainers that need byte offsets)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    core = Tokenizer(models.BPE())
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    core.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=320, special_tokens=SPECIALS[:7],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    core.train_from_iterator([sentence(i, 8) for i in range(200)], trainer=trainer)
    tok = PreTrainedTokenizerFast(tokenizer_object=core, pad_token="<pad>", unk_token="<unk>", bos_token="<s>",
                                  eos_token="</s>")
    tok.chat_template = CHAT_TEMPLATE
    return tok


def llama(tok, kind: str = "causal", seed: int = 0):
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM, LlamaForSequenceClassification

    config = LlamaConfig(vocab_size=len(tok), hidden_size=16, intermediate_size=32, num_hidden_layers=2,
                         num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=128,
                         pad_token_id=tok.pad_token_id, bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
                         num_labels=1)
    torch.manual_seed(seed)
    return (LlamaForSequenceClassification if kind == "reward" else LlamaForCausalLM)(config)


def saved_once(out_dir: str, name: str, model, tok) -> str:
    """``model`` and ``tok`` saved for trainers that load by path, so that no process reads them half-written: where
    a process group is up the first process writes them (save_pretrained writes no config on the others) and the
    others wait; before one is (several processes started, none joined yet) each process writes a folder of its own.
    Every process builds the model, so each draws the same random numbers."""
    import torch

    group = torch.distributed.is_available() and torch.distributed.is_initialized()
    rank = int(os.environ.get("RANK", "0"))
    folder = os.path.join(out_dir, name if group or rank == 0 else f"{name}-rank{rank}")
    if not group or torch.distributed.get_rank() == 0:
        model.save_pretrained(folder)
        tok.save_pretrained(folder)
    if group:
        torch.distributed.barrier()
    return folder


def saved_llama(tok, out_dir: str, seed: int = 0, name: str = "initial_model") -> str:
    """A Llama in a folder, for trainers that take a path (and load a reference copy from it)."""
    return saved_once(out_dir, name, llama(tok, seed=seed), tok)


def bert_config(tok, **extra):
    from transformers import BertConfig

    return BertConfig(vocab_size=len(tok), hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                      intermediate_size=64, max_position_embeddings=128, pad_token_id=tok.pad_token_id, **extra)


def saved_bert(tok, out_dir: str, cls_name: str = "BertModel", seed: int = 0, **extra) -> str:
    """A tiny BERT (``cls_name`` from transformers) saved with the tokenizer, for libraries that load by path."""
    import torch
    import transformers

    torch.manual_seed(seed)
    return saved_once(out_dir, "bert", getattr(transformers, cls_name)(bert_config(tok, **extra)), tok)


def sentence(i: int, n: int = 5) -> str:
    return " ".join(WORDS[(i * 7 + k * 3) % len(WORDS)] for k in range(n + i % 4))


def rows(kind: str, n: int, offset: int = 0) -> list[dict]:
    """``n`` rows of one of TRL's dataset kinds (text, messages, prompt-completion, preference, ...)."""
    idx = range(offset, offset + n)
    if kind == "text":
        return [{"text": sentence(i, 4 + i % 5)} for i in idx]
    if kind == "messages":
        return [{"messages": [{"role": "user", "content": sentence(i, 3)},
                              {"role": "assistant", "content": sentence(i + 1, 4)}]} for i in idx]
    if kind == "completion":
        return [{"prompt": sentence(i, 3), "completion": sentence(i + 2, 4)} for i in idx]
    if kind == "unpaired":
        return [{"prompt": sentence(i, 3), "completion": sentence(i + 2, 4), "label": i % 2 == 0} for i in idx]
    if kind == "preference":
        return [{"prompt": sentence(i, 3), "chosen": sentence(i + 1, 4), "rejected": sentence(i + 5, 3)} for i in idx]
    if kind == "triple":
        return [{"prompt": sentence(i, 3), "chosen": sentence(i + 1, 4), "rejected": sentence(i + 5, 3),
                 "reference": sentence(i + 9, 4)} for i in idx]
    if kind == "implicit":
        return [{"chosen": sentence(i, 6), "rejected": sentence(i + 3, 5)} for i in idx]
    if kind == "privileged":  # a prompt and the context only SDFT's teacher sees (a demonstration)
        return [{"prompt": sentence(i, 3), "privileged_context": sentence(i + 2, 4)} for i in idx]
    if kind == "prompt":
        return [{"prompt": sentence(i, 3)} for i in idx]
    if kind == "prompt_messages":
        return [{"prompt": [{"role": "user", "content": sentence(i, 3)}]} for i in idx]
    raise ValueError(kind)


def toy_reward(completions, **kwargs):
    """More distinct words scores higher: a reward that varies over sampled completions."""
    return [float(len(set(str(c).split()))) for c in completions]
