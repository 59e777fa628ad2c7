"""Causal mediation of subject-verb agreement in one checkpoint (issue 80, docs/interventions.md):
Finlayson et al. 2021's experiment ("Causal analysis of syntactic agreement mechanisms in neural
language models", ACL) on the workbench's agreement templates (Marvin & Linzen 2018,
workbench/data/pair_templates.py), with activation patching (`probes.patching`) at every layer's
residual stream, attention and MLP outputs and every head, the mediation effects of
`probes.mediation`, and attribution patching checked against real patching.

Items. Each agreement template item ("The author near the guards laughs .") gives a clean input u,
and the intervention u' swaps the subject for its other-number form ("authors": Finlayson et al.'s
swap-number); the control intervention swaps it for another noun of the same number ("pilot": the
token changes, the number does not), whose effects are the floor of the intervention's. The two forms
are the verb of the item and its other-number form (laughs / laugh), read at the position that
predicts the verb, as the family's LM reads it (`VIEWS`, keyed by `Family.lm_inputs`), each form scored
by all its subwords: d(u) = log p(right | u) - log p(wrong | u), the whole-form log-probabilities
Finlayson et al.'s y(u) = p(wrong) / p(right) is made of (`Family.residual_logits` on the last hidden
state). A decoder reads the prefix and each form teacher-forced (the chain rule over its pieces); a
masked LM scores each form by PLL-word-l2r (Kauf & Ivanova 2023, "A Better Way to Do Masked Language
Model Scoring"): piece j read with the pieces from j on masked, the pieces before it visible. With
one-piece forms both are the logit difference of the two forms at one position. Where the intervened
subject takes another number of subwords than the clean one ("author" one piece, "authors" two), the two
inputs are aligned by word (`word_alignment`, Vig et al. 2020; Finlayson et al. 2021): the subject's last
piece patches the subject's last piece, every later position its counterpart, the positions before the
subject themselves, and the subject's other pieces keep the base run's values; the item is kept.
`interventions_run.json` counts the items aligned token by token and by word, and the skipped ones.

`interventions_model(path, out_dir, config)` writes two tidy tables:

- `interventions`: model, variant ("trained" | "random_init": the same architecture with fresh
  weights drawn under `plmodels.checkpoint.floor_seed(seed, t)`, seed t + `seed` for a checkpoint
  pretrained under seed t, `seed` when t is unknown), intervention ("swap_number" | "same_number"),
  site (hook label), site_kind, layer, head (-1: the whole site), position ("all" | "subject" |
  "reading": the site patched at the subject's last token or at the position that reads the verb
  alone), metric, value, ci_low, ci_high (bootstrap over items), n_items, seed. Metrics:
  "te_ratio" / "nie_ratio" / "nde_ratio" (Finlayson et al.'s effects, mean of y ratios - 1),
  "te_log" / "nie_log" / "nde_log" (the same in nats of d), "restored" (the denoising
  run's share of the clean-minus-corrupt difference d), "attribution_nie_log" (attribution
  patching's estimate of nie_log, no interval); and per run, at site "input" (site_kind "input", layer
  -1) like the TE: "logit_diff_clean" / "logit_diff_corrupt" (mean d(u), d(u'); d is a logit
  difference when both forms are one piece), "accuracy_clean"
  (the share of items with d(u) > 0: the model prefers the agreeing form) and "iia_ceiling" (the share
  with d(u') < 0); per site "iia", interchange intervention accuracy (`probes.mediation.interchange_hits`,
  Geiger et al. 2021), the share of noising runs that prefer the form agreeing with u'.
- `interventions_attribution`: model, variant, intervention, sites ("all" | "top10": the ten sites of
  largest |nie_log| under real patching), metric ("spearman"), value, ci_low, ci_high (bootstrap over
  items, recomputing both rankings), n_sites, seed. The residual-stream sites patched at every position
  are left out: each one is the whole intervention (NIE = TE at every layer), a block of ties.
"""
from __future__ import annotations

import random
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import torch
from scipy.stats import spearmanr

import plmodels
from plmodels.checkpoint import floor_seed, random_init_model, read_card, training_seed
from plmodels.config import Config
from plmodels.families import FAMILIES, family_of
from probes.mediation import bootstrap_rows, interchange_hits, item_effects, restored_fraction
from probes.patching import GRID_KINDS, Site, attribution_patch, patch_sites, site_grid
from workbench.analyses.probing import default_model_name
from workbench.core.io import atomic_write_json
from workbench.core.results import write_tables
from workbench.data.minimal_pairs import PairRecord, template_pairs
from workbench.data.pair_templates import NOUNS, OTHER_NOUNS

COLUMNS = ["model", "variant", "intervention", "site", "site_kind", "layer", "head", "position", "metric", "value",
           "ci_low", "ci_high", "n_items", "seed"]
ATTR_COLUMNS = ["model", "variant", "intervention", "sites", "metric", "value", "ci_low", "ci_high", "n_sites", "seed"]
AGREEMENT_TEMPLATES = ("agr_pp", "agr_obj_rel", "agr_sent_comp")
INTERVENTIONS = ("swap_number", "same_number")
FLOORS = ("random_init",)
POSITIONS = ("subject", "reading")  # per-item token positions a residual-stream site can be patched at
TOP_K = 10


@dataclass(frozen=True)
class InterventionsConfig(Config):
    """One checkpoint's agreement mediation run (defaults: what a run config would hold)."""

    templates: tuple[str, ...] = AGREEMENT_TEMPLATES  # agreement templates of workbench/data/pair_templates.py
    n_per_template: int = 100  # items drawn per template (seeded), before the alignment filter
    site_kinds: tuple[str, ...] = ("resid_post", "attn_out", "mlp_out", "head_out")  # probes.patching site kinds
    # every site of position_kinds is also patched at each of these positions alone: the subject's last
    # token (Meng et al. 2022's causal tracing), and the position that reads the verb
    positions: tuple[str, ...] = POSITIONS
    position_kinds: tuple[str, ...] = ("resid_post", "attn_out", "mlp_out", "head_out")  # kinds of the position grid
    interventions: tuple[str, ...] = INTERVENTIONS  # swap_number (the experiment) | same_number (its control)
    floors: tuple[str, ...] = FLOORS  # random_init: the same run on fresh weights
    attribution: bool = True  # attribution patching beside real patching, and their rank agreement
    n_boot: int = 1000  # bootstrap resamples over items
    batch_size: int = 128  # items per forward
    seed: int = 0  # templates, control nouns, bootstrap, the random-init model (offset by the pretraining seed)

    def __post_init__(self) -> None:
        for name, allowed in (("templates", AGREEMENT_TEMPLATES), ("site_kinds", GRID_KINDS), ("position_kinds", GRID_KINDS),
                              ("interventions", INTERVENTIONS), ("floors", FLOORS), ("positions", POSITIONS)):
            value = tuple(getattr(self, name))
            object.__setattr__(self, name, value)
            bad = [v for v in value if v not in allowed]
            if bad or (not value and name not in ("floors", "positions", "position_kinds")):
                raise ValueError(f"InterventionsConfig.{name}: {bad or '[]'}; choose from {allowed}")
        if "swap_number" not in self.interventions:
            raise ValueError("InterventionsConfig.interventions must include 'swap_number' (the experiment)")
        for name in ("n_per_template", "n_boot", "batch_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"InterventionsConfig.{name} must be >= 1, got {getattr(self, name)}")


# ----------------------------------------------------------------------------------- the items
_OTHER_NUMBER = {s: p for s, p in NOUNS + OTHER_NOUNS} | {p: s for s, p in NOUNS + OTHER_NOUNS}
_SAME_NUMBER = {w: [x[i] for x in table if x[i] != w] for table in (NOUNS, OTHER_NOUNS) for i in (0, 1)
                for w in (t[i] for t in table)}


def agreement_items(cfg: InterventionsConfig) -> list[PairRecord]:
    """The agreement template items of the chosen templates (`n_per_template` each, seeded)."""
    return [r for r in template_pairs(cfg.n_per_template, cfg.seed) if r.source in cfg.templates]


def intervene(r: PairRecord, intervention: str, seed: int) -> tuple[str, ...]:
    """The item's grammatical sentence with its subject swapped: for its other-number form
    (swap_number) or for another noun of its number (same_number, drawn with the item's id)."""
    subj = r.critical - r.distance
    noun = r.good[subj]
    new = (_OTHER_NUMBER[noun] if intervention == "swap_number"
           else random.Random(f"{seed}:{r.id}").choice(_SAME_NUMBER[noun]))
    return r.good[:subj] + (new,) + r.good[subj + 1:]


def _swapped(words: tuple[str, ...], r: PairRecord, intervention: str, seed: int) -> tuple[str, ...]:
    """`words` (the item's sentence with either verb form) with the subject swapped as `intervene` does."""
    subj = r.critical - r.distance
    return words[:subj] + (intervene(r, intervention, seed)[subj],) + words[subj + 1:]


@dataclass(frozen=True)
class Row:
    """One scored input: its ids, the (position, id) targets whose log-probabilities it sums, the position
    that reads the verb's first piece and the subject's first and last tokens."""

    ids: tuple[int, ...]
    targets: tuple[tuple[int, int], ...]
    reading: int
    subject: int  # the subject's last token (the one that has read the whole noun)
    subject_start: int  # the subject's first token


def _causal_rows(tok, words: tuple[str, ...], critical: int, subject: int) -> list[Row]:
    """A decoder: the ids before the verb (BOS first) followed by the form's pieces, teacher-forced; the row
    sums log p(piece_j | prefix, pieces before j), the chain rule's whole-form log-probability."""
    e = tok.encode_words(list(words))
    s, t = e.word_spans[critical]
    a, b = e.word_spans[subject]
    return [Row(tuple(e.ids[:t]), tuple((p - 1, e.ids[p]) for p in range(s, t)), s - 1, b - 1, a)]


def _masked_rows(tok, words: tuple[str, ...], critical: int, subject: int) -> list[Row]:
    """A masked LM, PLL-word-l2r on the verb (Kauf & Ivanova 2023): row j masks the form's pieces j..k-1
    and reads piece j there, so the rows sum log p(piece_j | context, pieces before j); one piece is the
    sentence with the verb masked, read at the mask. The subject comes before the verb: its positions are
    the sentence's."""
    e = tok.encode_words(list(words))
    s, t = e.word_spans[critical]
    a, b = e.word_spans[subject]
    ids = list(e.ids)
    return [Row(tuple(ids[:p] + [tok.mask_id] * (t - p) + ids[t:]), ((p, ids[p]),), s, b - 1, a)
            for p in range(s, t)]


# Family.lm_inputs -> rows(tok, words, verb index, subject index): the inputs whose summed target
# log-probabilities are log p(verb form | the rest of the sentence) as that kind of LM reads it
VIEWS: dict[str, Callable] = {"causal": _causal_rows, "masked": _masked_rows}


def word_alignment(a: Row, b: Row) -> tuple[int, ...] | None:
    """Where each position of row a's input is in row b's, aligned by word (Vig et al. 2020; Finlayson et
    al. 2021): a position before the subject is itself, the subject's last token is b's subject's last
    token, and every later position moves by the difference of the two subjects' lengths; a subject's
    other tokens have no counterpart (-1) unless both subjects have one length (then every position is
    itself: token alignment). None when the rows differ anywhere but in the subject (their contexts,
    targets or reading positions do not correspond)."""
    shift = b.subject - a.subject
    if not (a.subject_start == b.subject_start and a.ids[:a.subject_start] == b.ids[:b.subject_start]
            and a.ids[a.subject + 1:] == b.ids[b.subject + 1:] and a.reading + shift == b.reading
            and [(p + shift, t) for p, t in a.targets] == list(b.targets)):
        return None
    if shift == 0:
        return tuple(range(len(a.ids)))
    return tuple(p if p < a.subject_start else p + shift if p >= a.subject else -1 for p in range(len(a.ids)))


@dataclass
class Items:
    """Aligned clean / intervened batches of the kept items, one batch row per scored input (R rows: each
    item's rows for the agreeing form, sign +1, and for the other form, sign -1), and their bookkeeping.
    A row of the intervened batch may be longer or shorter than its clean row (the subject took another
    number of subwords): `to_corrupt` / `to_clean` align them by word (`word_alignment`)."""

    clean: dict[str, torch.Tensor]  # (R, T) input_ids, attention_mask
    corrupt: dict[str, torch.Tensor]
    position: torch.Tensor  # (R,) the position that reads the verb's first piece (clean rows)
    subject: torch.Tensor  # (R,) the subject's last token (the one that has read the whole noun; clean rows)
    target_pos: torch.Tensor  # (R, P) positions whose log-probabilities a row sums (P: the most per row; clean)
    target_id: torch.Tensor  # (R, P) the pieces read there
    target_mask: torch.Tensor  # (R, P) bool, False on padding
    owner: torch.Tensor  # (R,) the row's item
    sign: torch.Tensor  # (R,) +1.0: a piece of the agreeing form; -1.0: of the other form
    ids: list[str]  # (N,) the kept items' ids
    skipped: dict[str, int]
    pieces: dict[str, int]  # kept items whose forms have one piece each ("single") or more ("multi")
    corrupt_position: torch.Tensor  # (R,) `position` in the intervened rows
    corrupt_subject: torch.Tensor  # (R,) `subject` in the intervened rows
    corrupt_target_pos: torch.Tensor  # (R, P) `target_pos` in the intervened rows
    to_corrupt: torch.Tensor  # (R, T) the intervened row's position of each clean position (-1: none)
    to_clean: torch.Tensor  # (R, T) the clean row's position of each intervened position (-1: none)
    aligned: dict[str, int]  # kept items aligned token by token ("token") or by word only ("word")

    def per_item(self, x: torch.Tensor) -> torch.Tensor:
        """(..., R) row scores -> (..., N): each item's agreeing-form sum minus the other form's."""
        out = torch.zeros(*x.shape[:-1], len(self.ids), dtype=x.dtype)
        return out.index_add_(x.dim() - 1, self.owner, x * self.sign.to(x.dtype))


def build_items(model, tok, records: list[PairRecord], intervention: str, seed: int) -> Items:
    """Tokenise every item in the family's view and align its intervened rows by word (`word_alignment`);
    skip (and count) the items whose rows do not correspond outside the subject ("unaligned") and those
    whose two verb forms are the same pieces."""
    fam = family_of(model)
    if fam.lm_inputs not in VIEWS or fam.residual_logits is None:
        raise ValueError(f"interventions: a {model.kind} model has no agreement view (LM batch form "
                         f"{fam.lm_inputs!r}); views exist for {sorted(VIEWS)} with a residual readout")
    view = VIEWS[fam.lm_inputs]
    kept, skipped, pieces = [], {"unaligned": 0, "same_pieces": 0}, {"single": 0, "multi": 0}
    aligned = {"token": 0, "word": 0}
    for r in records:
        subj = r.critical - r.distance
        per_form = []
        for words in (r.good, r.bad):  # the agreeing form, then the other
            a = view(tok, words, r.critical, subj)
            b = view(tok, _swapped(words, r, intervention, seed), r.critical, subj)
            maps = ([(word_alignment(x, y), word_alignment(y, x)) for x, y in zip(a, b)]
                    if len(a) == len(b) else [None])
            per_form.append((a, b, maps))
        form_pieces = [[t for x in a for _, t in x.targets] for a, _, _ in per_form]
        if form_pieces[0] == form_pieces[1]:  # e.g. both forms unknown words: nothing tells them apart
            skipped["same_pieces"] += 1
            continue
        if any(m is None or None in m for *_, maps in per_form for m in maps):
            skipped["unaligned"] += 1
            continue
        pieces["single" if max(map(len, form_pieces)) == 1 else "multi"] += 1
        same_length = all(len(x.ids) == len(y.ids) for a, b, _ in per_form for x, y in zip(a, b))
        aligned["token" if same_length else "word"] += 1
        kept.append((r.id, [(a, b, maps, sign) for (a, b, maps), sign in zip(per_form, (1.0, -1.0))]))
    if not kept:
        raise ValueError(f"interventions: no item survives tokenisation ({skipped})")
    rows = [(i, x, y, m, sign) for i, (_, forms) in enumerate(kept) for a, b, maps, sign in forms
            for x, y, m in zip(a, b, maps)]
    T = max(max(len(x.ids), len(y.ids)) for _, x, y, _, _ in rows)
    P = max(len(x.targets) for _, x, _, _, _ in rows)

    def batch(k: int) -> dict[str, torch.Tensor]:
        ids = torch.full((len(rows), T), tok.pad_id, dtype=torch.long)
        mask = torch.zeros(len(rows), T, dtype=torch.long)
        for i, row in enumerate(rows):
            ids[i, : len(row[k].ids)] = torch.tensor(row[k].ids)
            mask[i, : len(row[k].ids)] = 1
        return {"input_ids": ids, "attention_mask": mask}

    def alignment(k: int) -> torch.Tensor:
        """(R, T): token-aligned rows map every position (padding too) to itself, as without an alignment."""
        out = torch.arange(T).repeat(len(rows), 1)
        for i, (_, x, y, m, _) in enumerate(rows):
            if len(x.ids) != len(y.ids):
                out[i] = -1
                out[i, : len(m[k])] = torch.tensor(m[k])
        return out

    def targets(k: int) -> torch.Tensor:
        pos = torch.zeros(len(rows), P, dtype=torch.long)
        for i, row in enumerate(rows):
            for j, (p, _) in enumerate(row[k].targets):
                pos[i, j] = p
        return pos

    tid = torch.zeros(len(rows), P, dtype=torch.long)
    tmask = torch.zeros(len(rows), P, dtype=torch.bool)
    for i, (_, x, _, _, _) in enumerate(rows):
        for j, (_, t) in enumerate(x.targets):
            tid[i, j], tmask[i, j] = t, True
    return Items(batch(1), batch(2), torch.tensor([x.reading for _, x, _, _, _ in rows]),
                 torch.tensor([x.subject for _, x, _, _, _ in rows]), targets(1), tid, tmask,
                 torch.tensor([i for i, *_ in rows]), torch.tensor([s for *_, s in rows]),
                 [i for i, _ in kept], skipped, pieces,
                 torch.tensor([y.reading for _, _, y, _, _ in rows]),
                 torch.tensor([y.subject for _, _, y, _, _ in rows]),
                 targets(2), alignment(0), alignment(1), aligned)


def form_logprob_score(items: Items) -> Callable:
    """score(model, batch) -> (n,) each row's summed log-probability of its targets (the family's residual
    readout on the last hidden state); `Items.per_item` turns rows into d(u) = log p(agreeing form) -
    log p(other form), the logit difference when both forms are one piece. The batch carries the rows'
    indices in "row" (patch_sites passes chunks of the batch) and their target positions in "target_pos"
    (the intervened rows' differ where the subject took another number of subwords; default: the clean
    rows')."""
    def score(model, batch: Mapping[str, torch.Tensor]) -> torch.Tensor:
        fam = family_of(model)
        rows = batch["row"]
        tpos = batch["target_pos"] if "target_pos" in batch else items.target_pos[rows]
        inputs = {k: v for k, v in batch.items() if k not in ("row", "target_pos")}
        out = fam.forward_batch(model, inputs, None, output_hidden_states=True, **fam.analysis_kwargs)
        h = out.hidden_states[-1][torch.arange(len(rows))[:, None], tpos]  # (n, P, D)
        logp = fam.residual_logits(model, h).float().log_softmax(-1)  # (n, P, V)
        lp = logp.gather(-1, items.target_id[rows, :, None])[..., 0]  # (n, P)
        return torch.where(items.target_mask[rows], lp, torch.zeros_like(lp)).sum(1)
    return score


def _row_batches(items: Items) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """(clean, corrupt, positions): the batches with their row indices and target positions, the clean
    rows' patch positions."""
    rows = torch.arange(len(items.owner))
    return ({**items.clean, "row": rows, "target_pos": items.target_pos},
            {**items.corrupt, "row": rows, "target_pos": items.corrupt_target_pos},
            {"subject": items.subject, "reading": items.position})


@dataclass(frozen=True)
class Direction:
    """One patching direction's arguments: base and source batches, the base rows' named positions and the
    source position of each base position (`patch_sites`' `positions` and `align`)."""

    base: dict[str, torch.Tensor]
    source: dict[str, torch.Tensor]
    positions: dict[str, torch.Tensor]
    align: torch.Tensor | None


def directions(items: Items) -> tuple[Direction, Direction]:
    """(noising, denoising): the clean run with sites from the intervened run, and the reverse, each with
    its base rows' positions; no alignment when every item is aligned token by token."""
    clean, corrupt, where = _row_batches(items)
    word = items.aligned["word"] > 0
    return (Direction(clean, corrupt, where, items.to_corrupt if word else None),
            Direction(corrupt, clean, {"subject": items.corrupt_subject, "reading": items.corrupt_position},
                      items.to_clean if word else None))


# ----------------------------------------------------------------------------------- the run
def mediate(model, items: Items, sites: list[Site], cfg: InterventionsConfig, attribution: bool
            ) -> tuple[list[tuple], np.ndarray, np.ndarray | None]:
    """(rows of (site, metric, value, lo, hi)), per-item nie_log (S, N), attribution estimate (S, N))."""
    noising, denoising = directions(items)
    score = form_logprob_score(items)
    d_clean, d_corrupt, noised = patch_sites(model, score, noising.base, noising.source, sites, cfg.batch_size,
                                             noising.positions, noising.align)
    _, _, denoised = patch_sites(model, score, denoising.base, denoising.source, sites, cfg.batch_size,
                                 denoising.positions, denoising.align)
    c, k, nz, dn = (items.per_item(t.double()).numpy() for t in (d_clean, d_corrupt, noised, denoised))
    out = []
    m, lo, hi = bootstrap_rows(np.stack([c, k, (c > 0).astype(float), (k < 0).astype(float)]), cfg.n_boot,
                               seed=cfg.seed)
    out += [(None, metric, m[i], lo[i], hi[i]) for i, metric in enumerate(
        ("logit_diff_clean", "logit_diff_corrupt", "accuracy_clean", "iia_ceiling"))]
    m, lo, hi = bootstrap_rows(interchange_hits(nz), cfg.n_boot, seed=cfg.seed)
    out += [(s, "iia", m[i], lo[i], hi[i]) for i, s in enumerate(sites)]
    for scale in ("ratio", "log"):
        eff = item_effects(c, k, nz, dn, scale=scale)
        for name in ("te", "nie", "nde"):
            m, lo, hi = bootstrap_rows(eff[name], cfg.n_boot, seed=cfg.seed)
            targets = [None] if name == "te" else sites
            out += [(s, f"{name}_{scale}", m[i], lo[i], hi[i]) for i, s in enumerate(targets)]
    m, lo, hi = restored_fraction(c, k, dn, cfg.n_boot, seed=cfg.seed)
    out += [(s, "restored", m[i], lo[i], hi[i]) for i, s in enumerate(sites)]
    nie_log = item_effects(c, k, nz, dn, scale="log")["nie"]
    approx = None
    if attribution:  # d(clean; z <- corrupt) - d(clean) ~ attribution, so nie_log ~ -attribution
        approx = -items.per_item(attribution_patch(model, score, noising.base, noising.source, sites, cfg.batch_size,
                                                   noising.positions, noising.align).double()).numpy()
        out += [(s, "attribution_nie_log", float(approx[i].mean()), np.nan, np.nan) for i, s in enumerate(sites)]
    return out, nie_log, approx


def _whole_stream(site: Site) -> bool:
    """A residual-stream site patched at every position: the whole intervention by construction (its NIE
    is the TE at every layer), so it is left out of the rank comparison, where it would be a block of ties."""
    return site.kind == "resid_post" and site.position is None


def rank_agreement(real: np.ndarray, approx: np.ndarray, n_boot: int, seed: int, top_k: int = TOP_K
                   ) -> list[tuple[str, float, float, float, int]]:
    """Spearman's rho between the mean real and attribution effects (S, N) over every site and over the
    top_k sites by |real mean|, each with a bootstrap over items (the top sites re-chosen per resample)."""
    def rhos(cols: np.ndarray) -> tuple[float, float]:
        r, a = real[:, cols].mean(1), approx[:, cols].mean(1)
        top = np.argsort(-np.abs(r), kind="stable")[:top_k]
        return float(spearmanr(r, a).statistic), float(spearmanr(r[top], a[top]).statistic)

    n = real.shape[1]
    point = rhos(np.arange(n))
    rng = np.random.default_rng(seed)
    boots = np.array([rhos(rng.integers(0, n, n)) for _ in range(n_boot)])
    lo, hi = np.nanquantile(boots, [0.025, 0.975], axis=0)
    return [("all", point[0], lo[0], hi[0], real.shape[0]),
            (f"top{top_k}", point[1], lo[1], hi[1], min(top_k, real.shape[0]))]


def intervention_kinds() -> list[str]:
    """The model kinds the analysis reads: a family with a residual readout and a view (`VIEWS`)."""
    return sorted(k for k, f in FAMILIES.items() if f.residual_logits is not None and f.lm_inputs in VIEWS)


def mediation_sites(model, cfg: InterventionsConfig) -> list[Site]:
    """The sites a run patches: `cfg.site_kinds` at every position, in forward order (one per head for head
    kinds), then for each of `cfg.positions` every site of `cfg.position_kinds` at that position alone
    (the per-position grid: each head and sub-layer at the subject, at the reading position)."""
    sites = site_grid(model, kinds=cfg.site_kinds)
    return sites + [Site(s.hook, s.head, p) for p in cfg.positions for s in site_grid(model, kinds=cfg.position_kinds)]


def kept_items(model, tok, intervention: str, cfg: InterventionsConfig) -> list[tuple[PairRecord, tuple[str, ...]]]:
    """The agreement items of `cfg` that survive tokenisation for `intervention`, each with its
    intervened sentence (what a run scores; empty when none survives)."""
    records = agreement_items(cfg)
    try:
        kept = set(build_items(model, tok, records, intervention, cfg.seed).ids)
    except ValueError:
        return []
    return [(r, intervene(r, intervention, cfg.seed)) for r in records if r.id in kept]


def item_effect(model, tok, record: PairRecord, intervention: str, site: Site, seed: int = 0) -> pd.DataFrame:
    """One item and one site, as the run computes them (its item then in a batch of one): the logit
    differences d of the clean run u, the intervened run u', the noising run (u with the site from u')
    and the denoising run (u' with the site from u), and the item's TE, NIE and NDE on both scales.
    Columns: quantity, value. A skipped item (no word alignment, the same pieces) is a ValueError."""
    items = build_items(model, tok, [record], intervention, seed)
    cfg = InterventionsConfig(n_boot=1, seed=seed)
    noising, denoising = directions(items)
    score = form_logprob_score(items)
    c, k, nz = (items.per_item(t.double()).numpy() for t in patch_sites(
        model, score, noising.base, noising.source, [site], cfg.batch_size, noising.positions, noising.align))
    dn = items.per_item(patch_sites(model, score, denoising.base, denoising.source, [site], cfg.batch_size,
                                    denoising.positions, denoising.align)[2].double()).numpy()
    out = [("d_clean", c[0]), ("d_intervened", k[0]), ("d_noised", nz[0, 0]), ("d_denoised", dn[0, 0])]
    for scale in ("log", "ratio"):
        eff = item_effects(c, k, nz, dn, scale=scale)
        out += [(f"{name}_{scale}", float(eff[name][0, 0])) for name in ("te", "nie", "nde")]
    return pd.DataFrame(out, columns=["quantity", "value"])


def interventions_model(model_path: str | Path, out_dir: str | Path | None = None,
                        config: InterventionsConfig | Mapping | str | Path | None = None,
                        model_name: str | None = None) -> dict[str, pd.DataFrame]:
    """Run the agreement mediation on one checkpoint -> {"interventions", "interventions_attribution"}
    (module docstring); with out_dir the tables are upserted into out_dir/tables and the run's config,
    item counts and timings go to out_dir/interventions_run.json."""
    cfg = InterventionsConfig.resolve(config)
    model, tok = plmodels.load(model_path)
    if tok is None:
        raise ValueError(f"{model_path}: the checkpoint has no tokenizer/ folder; the agreement items need one")
    name = model_name or default_model_name(model_path)
    if not read_card(model_path).lm_head_trained:
        # the readout is the LM head's verb-form logits: an untrained head (an ELECTRA discriminator, an imported
        # sentence encoder, a classifier) would be read as noise, so nothing is measured (as amnesic's LM rows)
        reason = f"{model_path}: its card says its LM head is untrained; agreement is read through the LM head"
        print(f"interventions: {name} not measured ({reason})", flush=True)
        tables = {"interventions": pd.DataFrame([], columns=COLUMNS),
                  "interventions_attribution": pd.DataFrame([], columns=ATTR_COLUMNS)}
        if out_dir is not None:
            write_tables(out_dir, tables)
            atomic_write_json(Path(out_dir) / "interventions_run.json",
                              {"config": cfg.to_dict(), "model": name, "not_measured": reason})
        return tables
    records = agreement_items(cfg)
    models = {"trained": model}
    fresh_seed = floor_seed(cfg.seed, training_seed(model_path))  # the analysis seed offset by the pretraining seed
    if "random_init" in cfg.floors:
        models["random_init"] = random_init_model(model, fresh_seed)
    sites = mediation_sites(model, cfg)
    rows, attr_rows, meta = [], [], {"seconds": {}, "items": {}}
    for intervention in cfg.interventions:
        items = build_items(model, tok, records, intervention, cfg.seed)
        meta["items"][intervention] = {"kept": len(items.ids), **items.skipped,
                                        "pieces": items.pieces, "aligned": items.aligned}
        for variant, m in models.items():
            t0 = time.perf_counter()
            out, real, approx = mediate(m, items, sites, cfg, cfg.attribution)
            for site, metric, value, lo, hi in out:
                where = ("input", "input", -1, -1, "all") if site is None else (
                    site.label, site.kind, site.layer, -1 if site.head is None else site.head,
                    "all" if site.position is None else str(site.position))
                rows.append((name, variant, intervention, *where, metric, float(value), float(lo), float(hi),
                             len(items.ids), cfg.seed))
            if approx is not None:
                keep = [i for i, s in enumerate(sites) if not _whole_stream(s)]
                if len(keep) >= 3:
                    attr_rows += [(name, variant, intervention, which, "spearman", rho, lo, hi, n_sites, cfg.seed)
                                  for which, rho, lo, hi, n_sites in
                                  rank_agreement(real[keep], approx[keep], cfg.n_boot, cfg.seed)]
            meta["seconds"][f"{intervention}:{variant}"] = round(time.perf_counter() - t0, 1)
    tables = {"interventions": pd.DataFrame(rows, columns=COLUMNS),
              "interventions_attribution": pd.DataFrame(attr_rows, columns=ATTR_COLUMNS)}
    if out_dir is not None:
        write_tables(out_dir, tables)
        atomic_write_json(Path(out_dir) / "interventions_run.json",
                          {"config": cfg.to_dict(), "model": name,
                           "random_init_seed": fresh_seed if "random_init" in cfg.floors else None, **meta})
    return tables


# ----------------------------------------------------------------------------------- the zoo
# the zoo's per-checkpoint statistics (`interventions_seed_values`)
ZOO_STATISTICS = ("interventions_attn_share", "interventions_top_layer_share")
ZOO_SITE_KINDS = ("attn_out", "mlp_out")  # the sub-layer outputs whose shares are compared


def interventions_seed_values(table: pd.DataFrame | None, variant: str = "trained"
                              ) -> dict[tuple[str, str], dict[str, float]]:
    """The zoo's per-checkpoint statistics of where agreement is mediated (`workbench.analyses.zoo`
    resamples them over pretraining seeds and compares systems), from an `interventions` table: of the
    swap-number NIE (log scale) of each layer's attention and MLP outputs patched at the reading position
    alone, with E = sum over layers l of |NIE(attn_out_l)| + |NIE(mlp_out_l)|,

    - "interventions_attn_share": sum_l |NIE(attn_out_l)| / E, attention's share (1 - it: the MLPs');
    - "interventions_top_layer_share": (|NIE(attn_out_L)| + |NIE(mlp_out_L)|) / E, the last layer L's.

    Magnitudes, so that a sub-layer pushing against the agreeing form counts as mediating too. A model
    without both kinds at the reading position, or with E = 0 (nothing mediated), has no value.
    `variant`: "trained", or "random_init" for the floor. -> {(statistic, task ""): {model: value}}."""
    if table is None or not len(table):
        return {}
    g = table[(table["variant"] == variant) & (table["intervention"] == "swap_number") & (table["metric"] == "nie_log")
              & (table["position"] == "reading") & table["site_kind"].isin(ZOO_SITE_KINDS) & (table["head"] == -1)]
    out: dict[tuple[str, str], dict[str, float]] = {}
    for model, m in g.groupby("model"):
        per = m.pivot_table(index="layer", columns="site_kind", values="value", aggfunc="first").abs()
        if set(per.columns) != set(ZOO_SITE_KINDS) or per.isna().any().any():
            continue
        total = float(per.to_numpy().sum())
        if total <= 0:
            continue
        out.setdefault((ZOO_STATISTICS[0], ""), {})[model] = float(per["attn_out"].sum()) / total
        out.setdefault((ZOO_STATISTICS[1], ""), {})[model] = float(per.loc[per.index.max()].sum()) / total
    return out
