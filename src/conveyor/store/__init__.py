"""The store: the protocol (:mod:`.base`) and its two dialects."""
