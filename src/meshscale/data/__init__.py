"""Real data: tokenizers, document sources (text, JSONL, Parquet), Megatron's indexed .bin/.idx format and
the packing of documents into training sequences. Pure numpy; torch is never imported here."""
