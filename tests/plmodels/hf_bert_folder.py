"""A random Hugging Face BERT saved as a folder with its vocab.txt and tokenizer_config.json: what the
importer's parity tests and the sentence-scoring tests read through `import_hf_bert`."""
import json

import torch


def write_vocab(path, n):
    specials = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    words = ["the", "cat", "sat", "on", "mat", "dog", "##s", "ran"]
    tokens = specials + words + [f"w{i}" for i in range(n - len(specials) - len(words))]
    path.write_text("\n".join(tokens) + "\n")


def save_bert_folder(model, folder):
    """Save a transformers BERT `model` into `folder` with a vocab of its size, after shifting its
    LayerNorms and biases by 0.1 N(0, 1) so that they are non-trivial and a mapping slip shows."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "LayerNorm" in name or name.endswith("bias"):
                p.add_(0.1 * torch.randn_like(p))
    model.save_pretrained(folder)
    write_vocab(folder / "vocab.txt", model.config.vocab_size)
    (folder / "tokenizer_config.json").write_text(json.dumps({"do_lower_case": True}))
    return folder
