"""Operations on a whole Flow: batches and probes (batch), slimming, export to a notebook
(export) and its replay (replay), notebooks as programs (nbrun)."""
