"""plmodels: own transformer models (BERT-style encoder, GPT-2-style decoder), tokenizers, checkpoints.

Light on purpose: importing plmodels never imports transformers or streamlit.
"""

from .checkpoint import checkpoint_hash, load, save
from .decoder import Decoder, DecoderConfig
from .encoder import Encoder, EncoderConfig

__all__ = ["Encoder", "EncoderConfig", "Decoder", "DecoderConfig", "save", "load", "checkpoint_hash"]
