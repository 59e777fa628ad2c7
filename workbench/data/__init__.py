"""data: real corpora in, task records out.

Readers for CoNLL-U, IOB2, PTB brackets and GLUE TSV that name the file and line of bad input and
count what they skip (`readers`); the edge-probing tasks built from UD EWT, GUM and Universal NER
(`tasks`); subword-to-word alignment (`align`); and the finetuning tasks, SST-2 and UD POS, handed
to `plmodels.training.finetune` (`finetuning`); the minimal-pair suites (`minimal_pairs`) and the
lexicon and templates of the template-built ones (`pair_templates`). Imports only `workbench.core`.
"""
