"""Word-level attention (Clark et al. 2019): a hand-computed example of the sum-over-attended,
mean-over-attending rule, with each word row plus its special shares summing to 1. The store's
maps are checked against a per-word loop in test_extraction.py."""
import torch

from workbench.store.word_attention import word_attention_maps


def test_word_attention_hand_example():
    # tokens: [CLS] w0a w0b w1 [SEP] pad ; word 0 = tokens 1,2 ; word 1 = token 3
    A = torch.tensor([[.1, .2, .3, .3, .1, 0], [.5, .1, .1, .2, .1, 0], [.2, .2, .2, .2, .2, 0],
                      [.0, .4, .4, .1, .1, 0], [.2, .2, .2, .2, .2, 0], [1 / 6] * 6])
    att = A.view(1, 1, 6, 6)
    tok_word = torch.tensor([[-1, 0, 0, 1, -1, -1]])
    slot = torch.tensor([[0, -1, -1, -1, 1, -1]])
    word, special = word_attention_maps(att, tok_word, slot, n_words=2, n_special=2)
    # from word 0 = mean of rows 1, 2; to word 0 = sum of columns 1, 2
    exp_word = torch.tensor([[(.1 + .1 + .2 + .2) / 2, (.2 + .2) / 2], [.8, .1]])
    exp_special = torch.tensor([[(.5 + .2) / 2, (.1 + .2) / 2], [0.0, .1]])
    torch.testing.assert_close(word[0, 0], exp_word)
    torch.testing.assert_close(special[0, 0], exp_special)
    torch.testing.assert_close((word.sum(-1) + special.sum(-1))[0, 0], torch.ones(2))
