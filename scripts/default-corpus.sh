#!/usr/bin/env bash
# The default corpus, as `make run` trains on it, into outputs/data (relative to the repo):
#  1. the King James Bible (Debian's bible-kjv, 4.3 MB of English prose);
#  2. a 2048-id byte-level BPE tokenizer trained on it (outputs/data/tokenizer.model);
#  3. token shards in outputs/data/default (2% of the documents held out for validation).
#   scripts/default-corpus.sh [CTITAN]
set -euo pipefail
CTITAN=${1:-build/ctitan}
cd "$(dirname "$0")/.."
data=outputs/data
mkdir -p "$data"
if [ ! -s "$data/bible.txt" ]; then
  echo "== default corpus: bible-kjv =="
  bible gen1:1-rev22:21 < /dev/null > "$data/bible.txt.tmp" && mv "$data/bible.txt.tmp" "$data/bible.txt"
fi
echo "== tokenizer: 2048 ids (2046 BPE tokens + <|begin_of_text|>, <|end_of_text|>) =="
"$CTITAN" tokenizer train --vocab-size 2048 --input "$data/bible.txt" --out "$data/tokenizer.model"
echo "== prepare: token shards in $data/default =="
rm -rf "$data/default"
"$CTITAN" prepare --tokenizer "$data/tokenizer.model" --input "$data/bible.txt" \
  --out "$data/default" --doc-separator '\n\n' --val-fraction 0.02
