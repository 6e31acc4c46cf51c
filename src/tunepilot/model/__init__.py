"""The model a campaign trains (P1-P4): where the base comes from and how it is adapted.

    base.py    resolve a local folder, the bundled MiniLM or a pinned hub id; tokenizer;
               refuse pickled weights; record revision and weight hashes (P4)
    build.py   load the base, apply full fine-tuning or LoRA, setup checks (dead targets,
               a frozen new head), activation checkpointing
    params.py  the trainable report (P2) and the update audit (P3)
    tiny.py    tiny models built from config for tests and the quick demo

Importing this package imports nothing heavy; torch, transformers and peft load on first use.
"""
