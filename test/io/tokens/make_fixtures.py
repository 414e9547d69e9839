#!/usr/bin/env python3
"""Makes the token fixture that kfsdp's tests read (they need no tokenizers package): a small BPE
trained here on the shipped text (nothing from the Hub), and that text tokenized by
scripts/prepare-tokens into llm.c shards.

    python3 test/io/tokens/make_fixtures.py      # writes the files below, beside this script

Written:
  tokenizer.json          byte-level BPE, vocabulary 512, <|endoftext|> id 0 (tokenizers' BpeTrainer)
  kjv_val_000000.bin      the first 8,000 tokens (llm.c's uint16 shard: magic 20240520, version 1)
  kjv_train_00000N.bin    the rest, 40,000 tokens a shard (the last shorter)

The documents are data/kjv-genesis-exodus.txt's two books (Exodus begins at "Now these are the
names"), each followed by <|endoftext|>."""
import json, os, subprocess, sys, tempfile

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

here = os.path.dirname(os.path.abspath(__file__))
root = os.path.join(here, '..', '..', '..')
text = open(os.path.join(root, 'data', 'kjv-genesis-exodus.txt'), encoding='utf-8').read()
exodus = text.index('Now these are the names of the children of Israel')
books = [text[:exodus], text[exodus:]]

tokenizer = Tokenizer(models.BPE())
tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
tokenizer.decoder = decoders.ByteLevel()
trainer = trainers.BpeTrainer(vocab_size=512, special_tokens=['<|endoftext|>'],
                              initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
tokenizer.train_from_iterator(books, trainer=trainer)
tokenizer.save(os.path.join(here, 'tokenizer.json'))

for name in os.listdir(here):  # a shard fewer than before must not stay behind
    if name.startswith('kjv_') and name.endswith('.bin'):
        os.remove(os.path.join(here, name))
with tempfile.TemporaryDirectory() as tmp:
    corpus = os.path.join(tmp, 'books.jsonl')
    with open(corpus, 'w', encoding='utf-8') as f:
        for book in books:
            f.write(json.dumps({'text': book}) + '\n')
    subprocess.run([sys.executable, os.path.join(root, 'scripts', 'prepare-tokens'), '--tokenizer',
                    os.path.join(here, 'tokenizer.json'), '--out', os.path.join(here, 'kjv'), '--val-tokens', '8000',
                    '--shard-tokens', '40000', corpus], check=True)
