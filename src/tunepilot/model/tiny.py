"""Tiny real models built from config, offline, in milliseconds.

Used by the tests and by the demo when the bundled MiniLM is absent. They are real
transformers models with a real byte-level BPE tokenizer trained on the fly, saved as a
normal Hugging Face folder, so everything downstream takes the same code path as a real base.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

DEFAULT_CORPUS = [
    "my order 12345 has not arrived yet, where is it?",
    "I was charged twice for the blue kettle, please refund 19.99",
    "the laptop stand I bought on 2024-03-02 is broken",
    "how do I change the delivery address for order 88812?",
    "cancel my subscription please, I no longer need it",
    '{"order_id": "12345", "product": "kettle", "amount": 19.99, "date": "2024-03-02"}',
    "add this song to my playlist, what is the weather in Paris tomorrow",
    "book a table for two at an italian restaurant tonight at 8 pm",
    "0 1 2 3 4 5 6 7 8 9 . , : ; ? ! { } [ ] \" ' - _ / @ # $ % &",
]


CHAT_ROLE_TOKENS = ["<|system|>", "<|user|>", "<|assistant|>"]
TINY_CHAT_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}"
    "{{ '<|' + message['role'] + '|>' + '\n' }}"
    "{% if message['role'] == 'assistant' %}"
    "{% generation %}{{ message['content'] + eos_token }}{% endgeneration %}"
    "{% else %}{{ message['content'] + eos_token }}{% endif %}{{ '\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|assistant|>' + '\n' }}{% endif %}"
)
"""A chat template in the shape of TRL's assistant-only-loss templates: role headers, EOS ends
every turn (so generation stops there), assistant text inside `{% generation %}`."""


def train_tokenizer(
    directory: str | Path,
    corpus: Iterable[str] | None = None,
    vocab_size: int = 400,
    chat_template: str | None = None,
):
    """Train a byte-level BPE on `corpus`, wrap it for transformers, save it to `directory`.

    With `chat_template` the role headers become special tokens and the template is saved
    with the tokenizer, as an instruct model's tokenizer ships it."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    texts = list(corpus) if corpus is not None else DEFAULT_CORPUS
    tok = Tokenizer(models.BPE(unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=["<pad>", "<s>", "</s>", "<cls>", "<sep>"]
        + (CHAT_ROLE_TOKENS if chat_template else []),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts * 3, trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        pad_token="<pad>",
        bos_token="<s>",
        eos_token="</s>",
        cls_token="<cls>",
        sep_token="<sep>",
    )
    if chat_template:
        fast.add_special_tokens({"additional_special_tokens": CHAT_ROLE_TOKENS})
        fast.chat_template = chat_template
    fast.save_pretrained(str(directory))
    return fast


TINY_SHAPE = {
    "hidden_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "intermediate_size": 128,
    "max_position_embeddings": 512,
}
"""One shape for every tiny model: small enough for milliseconds per step on a CPU, deep
enough (2 layers) that per-layer code paths and LoRA targets are exercised."""


def build_tiny_llama(
    directory: str | Path,
    corpus: Iterable[str] | None = None,
    seed: int = 0,
    chat_template: str | None = None,
    vocab_size: int = 400,
    shape: dict[str, int] | None = None,
) -> Path:
    """A 2-layer Llama causal LM (~130k params) and its tokenizer, saved to `directory`;
    with `chat_template` (e.g. TINY_CHAT_TEMPLATE) a chat model's tokenizer. `vocab_size` and
    `shape` (keys of TINY_SHAPE) size it otherwise, e.g. for the extraction demo."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    tok = train_tokenizer(directory, corpus, vocab_size=vocab_size, chat_template=chat_template)
    config = LlamaConfig(
        vocab_size=len(tok),
        **{**TINY_SHAPE, **(shape or {})},
        num_key_value_heads=4,
        pad_token_id=tok.pad_token_id,
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
        tie_word_embeddings=False,
    )
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config)
    model.save_pretrained(str(directory), safe_serialization=True)
    return directory


def build_tiny_bert(
    directory: str | Path,
    corpus: Iterable[str] | None = None,
    seed: int = 0,
    with_head_labels: list[str] | None = None,
) -> Path:
    """A 2-layer BERT encoder and tokenizer saved to `directory`.

    Without `with_head_labels` only the encoder is saved, so loading it for sequence
    classification creates a new, untrained head (as with MiniLM). With it, a classifier head
    and its `id2label` are saved too (to test the D6 label-mapping check).
    """
    import torch
    from transformers import BertConfig, BertForSequenceClassification, BertModel

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    tok = train_tokenizer(directory, corpus)
    config = BertConfig(vocab_size=len(tok), **TINY_SHAPE, pad_token_id=tok.pad_token_id)
    torch.manual_seed(seed)
    if with_head_labels:
        config.id2label = dict(enumerate(with_head_labels))
        config.label2id = {name: i for i, name in enumerate(with_head_labels)}
        model = BertForSequenceClassification(config)
    else:
        model = BertModel(config)
    model.save_pretrained(str(directory), safe_serialization=True)
    return directory


def build_tiny_vit(directory: str | Path, seed: int = 0, image_size: int = 32) -> Path:
    """A 2-layer ViT encoder (patch 8, hidden 32) and its image processor, saved to `directory`.

    Only the encoder is saved, so loading it for image classification creates a new head, as
    with a real pretrained backbone. The processor is transformers' Pillow implementation, which
    needs no torchvision and decodes the same way on every machine.
    """
    import torch
    from transformers import ViTConfig, ViTModel
    from transformers.models.vit.image_processing_pil_vit import ViTImageProcessorPil

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    config = ViTConfig(
        image_size=image_size,
        patch_size=8,
        num_channels=3,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=64,
    )
    torch.manual_seed(seed)
    ViTModel(config, add_pooling_layer=False).save_pretrained(str(directory))
    processor = ViTImageProcessorPil(size={"height": image_size, "width": image_size})
    processor.save_pretrained(str(directory))
    return directory
