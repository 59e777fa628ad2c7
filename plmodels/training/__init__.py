"""Training: pretraining from scratch (masked LM for encoders, causal LM for decoders, and the BERT
family's other objectives: SpanBERT, ELECTRA, ALBERT's SOP, DistilBERT) and finetuning.

Entry points: `pretrain(config, out_dir)` (loop.py; the CLI `workbench pretrain` calls it),
`load_config` and `PretrainConfig` (config.py); `finetune` and `load_classifier` (finetune.py;
`workbench finetune` reaches them through workbench.data.finetuning).

| module          | job                                                                        |
|-----------------|----------------------------------------------------------------------------|
| config.py       | `PretrainConfig` and the config files it is read from (extends, overrides, paths) |
| corpus.py       | corpora: stream documents, tokenize once into a cached id file, pack rows  |
| masking.py      | training targets: BERT's MLM masks, NSP / SOP pairs, causal-LM shift       |
| denoising.py    | T5's span corruption and BART's text infilling for encoder-decoders      |
| plm.py          | XLNet's permutation-LM targets: factorisation orders, perm_mask, target_mapping |
| spans.py        | SpanBERT: span masking of whole words, the span-boundary head              |
| distil.py       | DistilBERT: the student from the teacher's layers, the triple loss         |
| schedule.py     | learning-rate schedules as pure functions of the step (or of the clock)    |
| data.py         | a run's tokenizer and token caches; micro-batches as a function of (step, rank) |
| loss.py         | the MLM / causal-LM loss of a batch, with the fused linear cross-entropy   |
| objectives.py   | the registry of objectives: what a step builds, computes and saves per system |
| runtime.py      | precision (bf16), the AdamW optimizer, progress lines, metrics.jsonl rows (and reading them back), the kill-test hook |
| distributed.py  | torchrun data parallelism: ranks, gradient averaging, rank 0's decisions   |
| state.py        | a checkpoint's training state (safetensors + JSON) and when checkpoints fall |
| evaluation.py   | held-out loss, perplexity, accuracy and the unigram baseline               |
| loop.py         | the run: config -> tokenizer -> data -> model -> steps -> checkpoints      |
| finetune.py     | finetuning a checkpoint on sentence or token classification                |

Imports run one way, down the table's jobs: loop.py imports the others; objectives.py builds on
data, loss, masking, spans and distil (and plmodels/electra.py); data, loss and evaluation build on
config, corpus, masking and distributed; finetune.py needs only config (its JSON reader),
masking, runtime and schedule. Outside this package the modules import plmodels' models, tokenizer,
presets, checkpoints and files; nothing else in plmodels imports training/ (the models never
depend on how they are trained).
"""

from .config import PretrainConfig, load_config
from .loop import pretrain

__all__ = ["PretrainConfig", "load_config", "pretrain"]
