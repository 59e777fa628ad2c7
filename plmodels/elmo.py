"""ELMo's biLM (Peters et al. 2018, "Deep contextualized word representations"): a forward and a
backward LSTM language model over the same tokens, whose layers are read as contextual word vectors.

Reading order: config -> per-row reversal -> one biLSTM layer -> the model -> the loss.

Following the paper (Section 3.1 and 3.4) and the authors' code (allenai/bilm-tf, `bilm/training.py`):
- L = 2 layers of LSTMs with projections (LSTMP, Sak et al. 2014: h_t = W_hr (o_t * tanh(c_t)), the
  recurrence reads the projected h_t), d_hidden cells and d_proj outputs per direction (the paper:
  4096 and 512), here `torch.nn.LSTM(proj_size=d_proj)`; d_proj == d_hidden is a plain LSTM.
- A residual connection from the first layer to the second (bilm-tf's ResidualWrapper on every layer
  but the first: layer l >= 1 outputs LSTM_l(x) + x).
- Both directions share the token representation and ONE softmax (Linear d_proj -> vocab with bias);
  each direction keeps its own LSTMs. The joint objective maximises
      sum_k  log p(t_k | t_1 .. t_{k-1}) + log p(t_k | t_{k+1} .. t_N)     (Section 3.1)
  and, as bilm-tf's `total_loss = 0.5 (forward + backward)`, `bilm_loss` returns the mean of the two
  directions' mean NLLs (same optimum as the sum, half its gradient) and both parts; the paper
  reports the average of the two directions' perplexities.
- Dropout on the input of every LSTM layer and on the top layer's output before the softmax
  (bilm-tf's DropoutWrapper(input_keep_prob) and the dropout before `_build_loss`).
- Representations (Section 3.2): layer 0 is the token representation duplicated, [x; x], so that
  it is 2 d_proj wide like the others; layer j is [forward_j; backward_j] at each position. A task
  mixes them as gamma * sum_j softmax(s)_j h_j (Section 3.2, Eq. 1): `probes.scalar_mix.ScalarMix` is exactly
  that (the paper's optional LayerNorm of each layer before the mix is not part of it).

Deviations:
- Input: subword ids of the project's tokenizer through an embedding table (d_embed, projected to
  d_proj when they differ, as the paper's char-CNN output is projected to 512), instead of the
  character CNN with highway layers: every model of the workbench then reads the same tokens, so
  layer-wise comparisons with BERT / GPT-2 align word for word.
- No cell or projection clipping (bilm-tf clips both at 3): torch's LSTM has no such option.
- Full softmax (through the fused cross-entropy when trained by `plmodels.training`), not the
  sampled softmax bilm-tf trains with.
Init: token embeddings N(0, 1) (torch's default), the embedding projection and the softmax
N(0, 1 / fan_in) with zero biases (bilm-tf), LSTMs torch's U(-1/sqrt(H), 1/sqrt(H)) with the forget
gate's bias at 1 (TensorFlow's LSTMCell default forget_bias=1).

Hook sites (`model.hooks`, as the other families; names are public API):
| name                  | shape           | what                                                    |
|-----------------------|-----------------|---------------------------------------------------------|
| `embed`               | (B, T, 2 P)     | [x; x] = hidden_states[0]                              |
| `blocks.{l}.fwd`      | (B, T, P)       | forward LM layer l (residual included), reading order  |
| `blocks.{l}.bwd`      | (B, T, P)       | backward LM layer l, at each token's own position       |
| `blocks.{l}.resid_post` | (B, T, 2 P)   | [fwd; bwd] = hidden_states[l+1]                        |
Layer l+1 reads its forward input from the first half and its backward input from the second half
of what `blocks.{l}.resid_post` (or `embed`) returns, so an edit there reaches the layers above.
The model has no attention: `n_heads_per_layer` is [0] * L and `config.n_heads` is 0.

The transformer control, `TransformerBiLM` (kind "tbilm"; the comparison of Peters et al. 2018b,
"Dissecting Contextual Word Embeddings: Architecture and Representation"): the same biLM with each
direction a causal transformer (the GPT-2 blocks of decoder.py) instead of an LSTM stack, the same
shared token embeddings and softmax, the same loss and the same hidden_states layout and hook sites
(`blocks.{l}.fwd_block` / `.bwd_block` are the two decoder blocks, whose own sites, e.g.
`blocks.{l}.bwd_block.attn.pattern`, see the backward stream in its own, reversed, order).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Literal

import torch
import torch.nn.functional as F
from torch import nn

from plmodels.config import Config

from .components.attention import keep_mask, resolve_attn_impl
from .components.dropout import Dropout
from .components.hooks import HookedModel, HookPoint
from .components.inputs import check_length
from .components.layers import init_weights, layer_norm
from .components.outputs import EncoderOutput
from .components.positions import alibi_distance, rope_cos_sin
from .decoder import Block, DecoderConfig


@dataclass(frozen=True)
class ElmoConfig(Config):
    vocab_size: int = 16000  # number of token ids
    d_embed: int = 512  # token embedding width E (projected to d_proj when different)
    d_hidden: int = 4096  # LSTM cells per direction and layer (ELMo: 4096)
    d_proj: int = 512  # LSTM output (projection) width P per direction (ELMo: 512); layers are 2 P wide
    n_layers: int = 2  # biLSTM layers L (ELMo: 2)
    dropout: float = 0.1  # on every LSTM layer's input and before the softmax (ELMo: 0.1)
    residual: bool = True  # layer l >= 1 outputs LSTM_l(x) + x (ELMo: from layer 1 to layer 2)
    max_positions: int = 1_000_000  # an LSTM has no length limit; for code that reads the field

    def __post_init__(self) -> None:
        for name in ("vocab_size", "d_embed", "d_hidden", "d_proj", "n_layers", "max_positions"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"ElmoConfig.{name} must be an int >= 1, got {value!r}")
        if self.d_proj > self.d_hidden:
            raise ValueError(f"ElmoConfig.d_proj={self.d_proj} must be <= d_hidden={self.d_hidden} "
                             "(a projection narrows the LSTM's output; equal means no projection)")
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"ElmoConfig.dropout must be in [0, 1), got {self.dropout!r}")

    @property
    def d_model(self) -> int:
        """Width of every layer's representation, [forward; backward]: 2 d_proj."""
        return 2 * self.d_proj

    @property
    def n_heads(self) -> int:
        """No attention heads (code that sizes attention arrays reads 0)."""
        return 0


@dataclass
class BiLMOutput:
    """What `ElmoBiLM.forward` and `TransformerBiLM.forward` return.

    last_hidden_state: (B, T, 2 P), [forward; backward] of the top layer (ElmoBiLM: = hidden_states[-1];
    TransformerBiLM: after each direction's final LayerNorm, as the decoder's).
    hidden_states: L+1 tensors (B, T, 2 P): layer 0, then each layer's [fwd; bwd]; or None.
    attentions: None (ElmoBiLM has none), or TransformerBiLM's L tensors (B, H, T, T) in reading
    order: heads [0, H/2) the forward LM's, [H/2, H) the backward LM's.
    logits / backward_logits: (B, T, V) next-token logits of the forward LM and previous-token logits
    of the backward LM (the shared softmax), when `return_logits=True`; else None.
    Positions past a row's length hold unspecified values.
    """

    last_hidden_state: torch.Tensor
    hidden_states: tuple[torch.Tensor, ...] | None = None
    attentions: tuple[torch.Tensor, ...] | None = None
    logits: torch.Tensor | None = None
    backward_logits: torch.Tensor | None = None


def reverse_index(lengths: torch.Tensor, seq_len: int) -> torch.Tensor:
    """(B, T) index that reverses each row's first lengths[b] positions and keeps its padding in place
    (right padding): lengths[b] - 1 - t for t < lengths[b], else t. It is its own inverse."""
    t = torch.arange(seq_len, device=lengths.device)
    return torch.where(t < lengths[:, None], lengths[:, None] - 1 - t, t)


def reverse_padded(x: torch.Tensor, lengths: torch.Tensor | None) -> torch.Tensor:
    """Reverse each row's real tokens along dim 1 (`reverse_index`); x (B, T, ...), lengths (B,) or
    None (no padding: a plain flip). Its own inverse."""
    if lengths is None:
        return x.flip(1)
    B, T = x.shape[:2]
    idx = reverse_index(lengths, T)
    return x.gather(1, idx.view(B, T, *([1] * (x.dim() - 2))).expand_as(x))


class BiLSTMLayer(nn.Module):
    """One layer: a forward and a backward LSTMP, each reading its half of the layer below."""

    def __init__(self, cfg: ElmoConfig, d_in: int, residual: bool) -> None:
        super().__init__()
        proj = cfg.d_proj if cfg.d_proj < cfg.d_hidden else 0  # 0: plain LSTM, output d_hidden = d_proj
        self.drop = Dropout(cfg.dropout)
        self.residual = residual
        self.fwd_lstm = nn.LSTM(d_in, cfg.d_hidden, batch_first=True, proj_size=proj)
        self.fwd = HookPoint()
        self.bwd_lstm = nn.LSTM(d_in, cfg.d_hidden, batch_first=True, proj_size=proj)
        self.bwd = HookPoint()
        self.resid_post = HookPoint()

    def forward(self, x: torch.Tensor, lengths: torch.Tensor | None) -> torch.Tensor:
        """x (B, T, 2 d_in) = [forward stream; backward stream] in reading order -> (B, T, 2 P)."""
        xf, xb = x.chunk(2, dim=-1)  # each (B, T, d_in)
        hf, _ = self.fwd_lstm(self.drop(xf))  # (B, T, P); padding comes after the real tokens
        hb, _ = self.bwd_lstm(reverse_padded(self.drop(xb), lengths))  # reads t = len-1 .. 0
        hb = reverse_padded(hb, lengths)  # back to reading order
        if self.residual:
            hf, hb = hf + xf, hb + xb
        return self.resid_post(torch.cat([self.fwd(hf), self.bwd(hb)], dim=-1))


def _init_lstm(lstm: nn.LSTM) -> None:
    """Forget-gate bias 1 (TensorFlow's LSTMCell, which bilm-tf uses); torch orders gates i, f, g, o."""
    H = lstm.hidden_size
    with torch.no_grad():
        for name, p in lstm.named_parameters():
            if name.startswith("bias_ih"):
                p[H: 2 * H].fill_(1.0)
            elif name.startswith("bias_hh"):
                p[H: 2 * H].zero_()


class ElmoBiLM(HookedModel, nn.Module):
    """ELMo's biLM. forward(input_ids (B, T), attention_mask (B, T) right-padded, ...) -> BiLMOutput."""

    kind = "bilm"

    def __init__(self, config: ElmoConfig) -> None:
        super().__init__()
        cfg = self.config = config
        self.wte = nn.Embedding(cfg.vocab_size, cfg.d_embed)  # shared by both directions
        self.embed_proj = nn.Linear(cfg.d_embed, cfg.d_proj) if cfg.d_embed != cfg.d_proj else None
        self.embed = HookPoint()
        self.blocks = nn.ModuleList(BiLSTMLayer(cfg, cfg.d_proj, residual=cfg.residual and l > 0)
                                    for l in range(cfg.n_layers))
        self.drop = Dropout(cfg.dropout)  # before the softmax
        self.softmax = nn.Linear(cfg.d_proj, cfg.vocab_size)  # ONE softmax for both directions
        for lin in (self.embed_proj, self.softmax):
            if lin is not None:
                nn.init.normal_(lin.weight, 0.0, lin.in_features ** -0.5)
                nn.init.zeros_(lin.bias)
        for block in self.blocks:
            _init_lstm(block.fwd_lstm)
            _init_lstm(block.bwd_lstm)
        self.name_hook_points()

    @property
    def n_heads_per_layer(self) -> list[int]:
        return [0] * self.config.n_layers

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        head_mask: torch.Tensor | None = None,
        output_hidden_states: bool = False,
        output_attentions: bool = False,
        attn_impl: str = "auto",
        return_logits: bool = False,
        unpad: bool = False,
    ) -> BiLMOutput:
        """attn_impl and unpad are accepted for the workbench's uniform calls and ignored (an LSTM
        over right padding already never lets a pad reach a real position)."""
        if output_attentions:
            raise ValueError("ElmoBiLM has no attention heads (an LSTM biLM): call it with output_attentions=False")
        if head_mask is not None:
            raise ValueError("ElmoBiLM has no attention heads: head_mask must be None")
        lengths = padded_lengths(attention_mask)
        x = self.wte(input_ids)  # (B, T, E)
        if self.embed_proj is not None:
            x = self.embed_proj(x)  # (B, T, P)
        x = self.embed(torch.cat([x, x], dim=-1))  # (B, T, 2 P): [x; x]
        hidden = [x]
        for block in self.blocks:
            x = block(x, lengths)
            hidden.append(x)
        logits = back = None
        if return_logits:
            P = self.config.d_proj
            logits, back = self.lm_logits(x[..., :P]), self.lm_logits(x[..., P:])
        return BiLMOutput(last_hidden_state=x, hidden_states=tuple(hidden) if output_hidden_states else None,
                          logits=logits, backward_logits=back)

    def lm_logits(self, h: torch.Tensor) -> torch.Tensor:
        """(..., P) one direction's top layer -> (..., V) logits of the shared softmax."""
        return self.softmax(h)


def padded_lengths(attention_mask: torch.Tensor | None) -> torch.Tensor | None:
    """(B,) real lengths of a right-padded mask (B, T); None when there is no padding. A mask with a
    pad before a real token is an error: the backward LM would start reading at the pad."""
    if attention_mask is None or bool(attention_mask.all()):
        return None
    lengths = attention_mask.long().sum(1)
    right = torch.arange(attention_mask.shape[1], device=attention_mask.device) < lengths[:, None]
    if not torch.equal(right, attention_mask.bool()):
        raise ValueError("a biLM needs right padding: every row's attention_mask must be ones, then zeros")
    return lengths


# --------------------------------------------------------------------------------------- the loss
def bilm_targets(hidden: torch.Tensor, input_ids: torch.Tensor, attention_mask: torch.Tensor | None,
                 d_proj: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """The predictions a biLM is scored on, from its top layer `hidden` (B, T, 2 P):
    forward: the state at t predicts token t+1; backward: the state at t predicts token t-1, for every
    t where both are real tokens. Returns (h_fwd (N, P), targets_fwd (N,), h_bwd (N, P),
    targets_bwd (N,)), N = sum over rows of (length - 1). Without a mask every pair is kept, in
    the same row-major order, by a reshape (no selection by a mask: nothing is read to the host)."""
    if attention_mask is None:  # (B (T-1), P) and (B (T-1),)
        return (hidden[:, :-1, :d_proj].flatten(0, 1), input_ids[:, 1:].flatten(),
                hidden[:, 1:, d_proj:].flatten(0, 1), input_ids[:, :-1].flatten())
    keep = attention_mask[:, 1:].bool()  # (B, T-1): position t+1 is real (so is t: right padding)
    h_fwd, y_fwd = hidden[:, :-1, :d_proj][keep], input_ids[:, 1:][keep]
    h_bwd, y_bwd = hidden[:, 1:, d_proj:][keep], input_ids[:, :-1][keep]
    return h_fwd, y_fwd, h_bwd, y_bwd


CrossEntropy = Callable[[torch.Tensor, torch.Tensor, torch.Tensor | None, torch.Tensor], torch.Tensor]


def summed_cross_entropy(hidden: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                         targets: torch.Tensor) -> torch.Tensor:
    """sum_i -log softmax(h_i W^T + b)[y_i]; hidden (N, D), weight (V, D), targets (N,) -> scalar."""
    return F.cross_entropy(F.linear(hidden, weight, bias).float(), targets, reduction="sum")


@dataclass
class BiLMLoss:
    """One batch's biLM loss: loss = (forward + backward) / 2 (bilm-tf), each a mean NLL over n."""

    loss: torch.Tensor
    forward: torch.Tensor
    backward: torch.Tensor
    n: int  # predictions per direction


def bilm_loss(model: "ElmoBiLM | TransformerBiLM", input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
              cross_entropy: CrossEntropy = summed_cross_entropy, head_mask: torch.Tensor | None = None) -> BiLMLoss:
    """Forward NLL of token t+1 given tokens <= t and backward NLL of token t-1 given tokens >= t,
    each averaged over the real positions, each direction through the shared softmax from its own
    top layer (dropout before the softmax in training). `cross_entropy(h, W, b, y)` returns the summed
    NLL (the training loop passes its fused kernel, `plmodels.training.loss.linear_cross_entropy`).
    head_mask: the transformer biLM's (L, H) gates (ElmoBiLM has no heads)."""
    kw = {} if head_mask is None else {"head_mask": head_mask}
    hidden = model(input_ids, attention_mask=attention_mask, **kw).last_hidden_state  # (B, T, 2 P)
    h_fwd, y_fwd, h_bwd, y_bwd = bilm_targets(hidden, input_ids, attention_mask, model.config.d_proj)
    n = int(y_fwd.numel())
    w, b = model.softmax.weight, model.softmax.bias
    fwd = cross_entropy(model.drop(h_fwd), w, b, y_fwd) / max(1, n)
    bwd = cross_entropy(model.drop(h_bwd), w, b, y_bwd) / max(1, n)
    return BiLMLoss(0.5 * (fwd + bwd), fwd, bwd, n)


# ------------------------------------------------------------------- the transformer control
@dataclass(frozen=True)
class TransformerBiLMConfig(Config):
    """Fields of the whole model: d_model and n_heads count both directions (each has half); the
    rest is each direction's GPT-2-style decoder (decoder.py's DecoderConfig fields)."""

    vocab_size: int = 16000  # number of token ids
    d_model: int = 512  # width of a layer's [forward; backward]; each direction is d_model / 2 wide
    n_layers: int = 6  # blocks per direction
    n_heads: int = 8  # heads per layer, both directions together
    d_ff: int = 1024  # MLP hidden width of each direction's blocks
    max_positions: int = 512  # longest sequence
    position: Literal["learned", "rope", "alibi"] = "learned"  # position encoding (per direction)
    norm: Literal["post", "pre"] = "pre"  # LayerNorm placement (GPT-2: pre)
    activation: Literal["gelu", "gelu_tanh", "relu"] = "gelu_tanh"  # MLP activation
    mlp: Literal["plain", "gated"] = "plain"  # gated = GLU with the activation
    bias: bool = True  # biases in linear layers and LayerNorms
    dropout: float = 0.1  # hidden and attention dropout
    layer_norm_eps: float = 1e-5  # GPT-2's epsilon

    def __post_init__(self) -> None:
        if self.d_model % 2 or self.n_heads % 2:
            raise ValueError(f"TransformerBiLMConfig.d_model={self.d_model} and n_heads={self.n_heads} must be "
                             "even (half for each direction)")
        try:
            direction_config(self)
        except ValueError as e:
            raise ValueError(f"TransformerBiLMConfig, each direction's decoder: {e}") from None

    @property
    def d_proj(self) -> int:
        """Width of one direction (what the shared softmax reads)."""
        return self.d_model // 2


def direction_config(cfg: TransformerBiLMConfig) -> DecoderConfig:
    """The decoder shape of one direction: half the width and half the heads."""
    return DecoderConfig(vocab_size=cfg.vocab_size, d_model=cfg.d_model // 2, n_layers=cfg.n_layers,
                         n_heads=cfg.n_heads // 2, d_ff=cfg.d_ff, max_positions=cfg.max_positions,
                         position=cfg.position, norm=cfg.norm, activation=cfg.activation, mlp=cfg.mlp,
                         bias=cfg.bias, dropout=cfg.dropout, layer_norm_eps=cfg.layer_norm_eps,
                         tie_embeddings=False)


def reverse_attention(probs: torch.Tensor, lengths: torch.Tensor | None) -> torch.Tensor:
    """(B, H, T, T) attention of the backward stream (reversed rows) -> reading order on both axes."""
    if lengths is None:
        return probs.flip(2).flip(3)
    B, H, T, _ = probs.shape
    idx = reverse_index(lengths, T)
    probs = probs.gather(2, idx[:, None, :, None].expand(B, H, T, T))
    return probs.gather(3, idx[:, None, None, :].expand(B, H, T, T))


class BiTransformerLayer(nn.Module):
    """One layer: a causal decoder block per direction, each reading its half of the layer below."""

    def __init__(self, dcfg: DecoderConfig) -> None:
        super().__init__()
        self.fwd_block = Block(dcfg)
        self.fwd = HookPoint()
        self.bwd_block = Block(dcfg)
        self.bwd = HookPoint()
        self.resid_post = HookPoint()

    def forward(self, x: torch.Tensor, lengths: torch.Tensor | None, keep, head_mask: torch.Tensor | None = None,
                **kw) -> tuple[torch.Tensor, Any]:
        """head_mask: (H,) over both directions, the forward block's heads first."""
        xf, xb = x.chunk(2, dim=-1)  # each (B, T, P), reading order
        mf, mb = (None, None) if head_mask is None else head_mask.chunk(2)
        hf, pf = self.fwd_block(xf, keep, head_mask=mf, **kw)
        hb, pb = self.bwd_block(reverse_padded(xb, lengths), keep, head_mask=mb, **kw)  # right padding stays right
        probs = None if pf is None else torch.cat([pf, reverse_attention(pb, lengths)], dim=1)  # (B, H, T, T)
        hb = reverse_padded(hb, lengths)
        return self.resid_post(torch.cat([self.fwd(hf), self.bwd(hb)], dim=-1)), probs


class TransformerBiLM(HookedModel, nn.Module):
    """Two causal transformers, one per direction, sharing the token (and position) embeddings and
    the softmax. forward(input_ids (B, T), attention_mask right-padded, ...) -> BiLMOutput; layer 0
    is [x + p_fwd(t); x + p_bwd(t)] with the backward LM's position counted from the row's end.
    Init: GPT-2's (decoder.py); the softmax N(0, 1 / d_proj) with a zero bias, as ElmoBiLM's."""

    kind = "tbilm"

    def __init__(self, config: TransformerBiLMConfig) -> None:
        super().__init__()
        cfg = self.config = config
        dcfg = direction_config(cfg)
        P = cfg.d_proj
        self.wte = nn.Embedding(cfg.vocab_size, P)
        self.wpe = nn.Embedding(cfg.max_positions, P) if cfg.position == "learned" else None
        self.emb_drop = Dropout(cfg.dropout)
        self.embed = HookPoint()
        self.blocks = nn.ModuleList(BiTransformerLayer(dcfg) for _ in range(cfg.n_layers))
        pre = cfg.norm == "pre"
        self.final_norm_fwd, self.final_norm_bwd = (layer_norm(dcfg), layer_norm(dcfg)) if pre else (None, None)
        self.drop = Dropout(0.0)  # GPT-2 has no dropout before its LM head (bilm_loss reads `drop`)
        self.softmax = nn.Linear(P, cfg.vocab_size)  # ONE softmax for both directions
        self.apply(init_weights)
        for layer in self.blocks:  # GPT-2: residual projections scaled by 1/sqrt(2 L)
            for block in (layer.fwd_block, layer.bwd_block):
                for proj in (block.attn.out, block.mlp.fc_out):
                    nn.init.normal_(proj.weight, 0.0, 0.02 / (2 * cfg.n_layers) ** 0.5)
        nn.init.normal_(self.softmax.weight, 0.0, P ** -0.5)
        self.name_hook_points()

    @property
    def n_heads_per_layer(self) -> list[int]:
        return [b.fwd_block.attn.n_heads + b.bwd_block.attn.n_heads for b in self.blocks]

    def head_out_sites(self) -> list[tuple[tuple[str, str], str]]:
        """Per layer: the hook sites of its heads' outputs, forward block then backward block (a
        head mask's order), and the batch key of the real positions (both streams pad on the right)."""
        return [((f"blocks.{l}.fwd_block.attn.head_out", f"blocks.{l}.bwd_block.attn.head_out"), "attention_mask")
                for l in range(len(self.blocks))]

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                head_mask: torch.Tensor | None = None, output_hidden_states: bool = False,
                output_attentions: bool = False, attn_impl: str = "auto", return_logits: bool = False,
                unpad: bool = False) -> BiLMOutput:
        """As ElmoBiLM.forward; attn_impl as the decoder's (attentions need the eager path); unpad is
        accepted and ignored. head_mask: (L, H), in each layer the forward direction's H / 2 heads
        first, then the backward's (the order of `attentions`)."""
        cfg = self.config
        B, T = input_ids.shape
        check_length(T, cfg.max_positions)
        if head_mask is not None and tuple(head_mask.shape) != (cfg.n_layers, cfg.n_heads):
            raise ValueError(f"head_mask must be (n_layers, n_heads)=({cfg.n_layers}, {cfg.n_heads}) (forward "
                             f"heads first), got {tuple(head_mask.shape)}")
        lengths = padded_lengths(attention_mask)
        eager = resolve_attn_impl(attn_impl, output_attentions=output_attentions, head_mask=head_mask,
                                  pattern_hooks=self._pattern_hooks_active())
        keep, is_causal = keep_mask(attention_mask, T, input_ids.device, causal=True,
                                    explicit=eager or cfg.position == "alibi")  # same for the reversed rows
        kw: dict[str, Any] = {"eager": eager, "is_causal": is_causal, "packing": None}
        if cfg.position == "rope":
            kw["rope"] = rope_cos_sin(T, cfg.d_proj // (cfg.n_heads // 2), input_ids.device)
        elif cfg.position == "alibi":
            kw["alibi_dist"] = alibi_distance(T, input_ids.device)
        e = self.wte(input_ids)  # (B, T, P)
        xf, xb = e, e
        if self.wpe is not None:  # the backward LM's position of token t is its distance from the row's end
            pos_b = (torch.arange(T - 1, -1, -1, device=e.device).expand(B, T) if lengths is None
                     else reverse_index(lengths, T))  # (B, T)
            xf, xb = e + self.wpe.weight[:T], e + self.wpe(pos_b)
        x = self.embed(torch.cat([self.emb_drop(xf), self.emb_drop(xb)], dim=-1))  # (B, T, 2 P)
        hidden, attns = [x], []
        for l, layer in enumerate(self.blocks):
            x, probs = layer(x, lengths, keep, head_mask=None if head_mask is None else head_mask[l], **kw)
            hidden.append(x)
            attns.append(probs)
        last = x
        if self.final_norm_fwd is not None:
            hf, hb = x.chunk(2, dim=-1)
            last = torch.cat([self.final_norm_fwd(hf), self.final_norm_bwd(hb)], dim=-1)
        logits = back = None
        if return_logits:
            logits, back = self.lm_logits(last[..., : cfg.d_proj]), self.lm_logits(last[..., cfg.d_proj:])
        return BiLMOutput(last_hidden_state=last, hidden_states=tuple(hidden) if output_hidden_states else None,
                          attentions=tuple(attns) if output_attentions else None, logits=logits,
                          backward_logits=back)

    def lm_logits(self, h: torch.Tensor) -> torch.Tensor:
        """(..., P) one direction's top layer -> (..., V) logits of the shared softmax."""
        return self.softmax(h)


# ------------------------------------------------------------------- one direction, read alone
class BiLMDirection(nn.Module):
    """One direction of a biLM (ElmoBiLM or TransformerBiLM) read as a language model of its own, for
    the flow suite's per-direction curves and lens (docs/flow.md).

    forward(input_ids, attention_mask) -> EncoderOutput whose hidden_states are the direction's half of
    each of the biLM's L + 1 layers (B, T, P), at each token's own position: the forward LM's state at
    t has read tokens <= t and predicts t + 1, the backward LM's has read tokens >= t and predicts t - 1;
    last_hidden_state is the half of the biLM's (after the transformer control's final norm).
    `final_norm` (the transformer control's norm of this direction; None for the LSTM) and `lm_logits`
    (the shared softmax) read any layer through the LM head. `kind` is "decoder": a causal LM's record
    reads it (which token it predicts is the biLM family's `flow_views`). Hidden states only."""

    kind = "decoder"

    def __init__(self, model: "ElmoBiLM | TransformerBiLM", direction: Literal["forward", "backward"]) -> None:
        super().__init__()
        if direction not in ("forward", "backward"):
            raise ValueError(f"BiLMDirection: direction must be 'forward' or 'backward', got {direction!r}")
        self.model, self.direction = model, direction
        self.config = model.config

    @property
    def n_heads_per_layer(self) -> list[int]:
        return [n // 2 for n in self.model.n_heads_per_layer]  # the transformer control's heads split by direction

    @property
    def final_norm(self) -> nn.Module | None:
        return getattr(self.model, "final_norm_fwd" if self.direction == "forward" else "final_norm_bwd", None)

    def lm_logits(self, h: torch.Tensor) -> torch.Tensor:
        """(..., P) -> (..., V): the shared softmax."""
        return self.model.lm_logits(h)

    def _half(self, x: torch.Tensor) -> torch.Tensor:
        P = self.model.config.d_proj
        return x[..., :P] if self.direction == "forward" else x[..., P:]

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                output_hidden_states: bool = False, output_attentions: bool = False, attn_impl: str = "auto",
                unpad: bool = False, return_logits: bool = False) -> EncoderOutput:
        if output_attentions or return_logits:
            raise ValueError("BiLMDirection gives hidden states only (no attentions, no logits)")
        out = self.model(input_ids, attention_mask=attention_mask, output_hidden_states=output_hidden_states,
                         attn_impl=attn_impl)
        hidden = None if out.hidden_states is None else tuple(self._half(h) for h in out.hidden_states)
        return EncoderOutput(last_hidden_state=self._half(out.last_hidden_state), hidden_states=hidden,
                             attentions=None)
