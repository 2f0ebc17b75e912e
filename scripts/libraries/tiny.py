"""Tiny models, tokenizers and data built in the process: the matrix downloads nothing (no Hub)."""

from __future__ import annotations

import os

WORDS = ("the cat dog sat ran on a mat red blue big small fast slow sun moon tree sky sea hill bird fish "
         "yes no good bad why how what who").split()
SPECIALS = ["<pad>", "<unk>", "<s>", "</s>", "<|user|>", "<|assistant|>", "<|system|>", "[CLS]", "[SEP]", "[MASK]"]
CHAT_TEMPLATE = ("{% for m in messages %}{{ '<|' + m['role'] + '|> ' + m['content'] + ' </s> ' }}{% endfor %}"
                 "{% if add_generation_prompt %}{{ '<|assistant|> ' }}{% endif %}")


def tokenizer(padding_side: str = "right"):
    """A word-level fast tokenizer over WORDS, with a chat template set by hand."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {w: i for i, w in enumerate(SPECIALS + WORDS)}
    core = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok = PreTrainedTokenizerFast(tokenizer_object=core, pad_token="<pad>", unk_token="<unk>", bos_token="<s>",
                                  eos_token="</s>", cls_token="[CLS]", sep_token="[SEP]", mask_token="[MASK]",
                                  padding_side=padding_side)
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


def saved_llama(tok, out_dir: str, seed: int = 0, name: str = "initial_model") -> str:
    """A Llama in a folder, for trainers that take a path (and load a reference copy from it)."""
    folder = os.path.join(out_dir, name)
    llama(tok, seed=seed).save_pretrained(folder)
    tok.save_pretrained(folder)
    return folder


def bert_config(tok, **extra):
    from transformers import BertConfig

    return BertConfig(vocab_size=len(tok), hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                      intermediate_size=64, max_position_embeddings=128, pad_token_id=tok.pad_token_id, **extra)


def saved_bert(tok, out_dir: str, cls_name: str = "BertModel", seed: int = 0, **extra) -> str:
    """A tiny BERT (``cls_name`` from transformers) saved with the tokenizer, for libraries that load by path."""
    import torch
    import transformers

    folder = os.path.join(out_dir, "bert")
    torch.manual_seed(seed)
    getattr(transformers, cls_name)(bert_config(tok, **extra)).save_pretrained(folder)
    tok.save_pretrained(folder)
    return folder


def sentence(i: int, n: int = 5) -> str:
    return " ".join(WORDS[(i * 7 + k * 3) % len(WORDS)] for k in range(n + i % 4))


def toy_reward(completions, **kwargs):
    """More distinct words scores higher: a reward that varies over sampled completions."""
    return [float(len(set(str(c).split()))) for c in completions]
