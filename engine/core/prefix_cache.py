"""Prefix cache index: content hash of a full KV block -> the block that holds it.

A full block is named by sha256(parent block hash || its token ids), so a hash stands for the
whole token prefix up to the block's end: equal hashes mean equal prefixes (vLLM's automatic
prefix caching). A cryptographic hash keeps a crafted prompt from colliding with another user's
prefix. Only blocks whose tokens are all verified and computed are registered (the block manager
enforces it), so K/V of unverified draft tokens never enters the index.

This module only keeps the index; ref counts and the free lists belong to BlockPool (each pool
keeps its own index: a hash names the prefix, the index the block holding it in that pool).
"""

from __future__ import annotations

import hashlib
from array import array
from collections.abc import Sequence

from engine.request import Request

BlockHash = bytes
_ROOT_HASH: BlockHash = b""


def hash_block_tokens(parent_hash: BlockHash, token_ids: Sequence[int]) -> BlockHash:
    """The hash of a full block given its parent's hash (b"" for the first block)."""
    return hashlib.sha256(parent_hash + array("q", token_ids).tobytes()).digest()


class PrefixCache:
    def __init__(self, block_size: int) -> None:
        self.block_size = block_size
        self._block_of_hash: dict[BlockHash, int] = {}
        self._hash_of_block: dict[int, BlockHash] = {}

    def request_hashes(self, request: Request, num_blocks: int) -> list[BlockHash]:
        """Hashes of the request's first `num_blocks` full token blocks. They are kept on the
        request (Request.block_hashes): tokens are append-only, so a computed hash stays valid
        for the request's life, preemptions included."""
        hashes = request.block_hashes
        size = self.block_size
        for index in range(len(hashes), num_blocks):
            parent = hashes[-1] if hashes else _ROOT_HASH
            block_token_ids = request.token_ids_between(index * size, (index + 1) * size)
            hashes.append(hash_block_tokens(parent, block_token_ids))
        return hashes[:num_blocks]

    def lookup(self, hashes: Sequence[BlockHash]) -> list[int]:
        """Block ids of the longest run of `hashes` (from the first) present in the index."""
        block_ids: list[int] = []
        for block_hash in hashes:
            block_id = self._block_of_hash.get(block_hash)
            if block_id is None:
                break
            block_ids.append(block_id)
        return block_ids

    def block_of(self, block_hash: BlockHash) -> int | None:
        """The block indexed under `block_hash`, or None."""
        return self._block_of_hash.get(block_hash)

    def register(self, block_id: int, block_hash: BlockHash) -> bool:
        """Index `block_id` under `block_hash`; False when either is already indexed
        (another block computed the same prefix first: the index keeps that one)."""
        if block_hash in self._block_of_hash or block_id in self._hash_of_block:
            return False
        self._block_of_hash[block_hash] = block_id
        self._hash_of_block[block_id] = block_hash
        return True

    def is_cached(self, block_id: int) -> bool:
        return block_id in self._hash_of_block

    def evict(self, block_id: int) -> None:
        """Drop a block from the index (it is about to hold other tokens)."""
        block_hash = self._hash_of_block.pop(block_id, None)
        if block_hash is not None:
            del self._block_of_hash[block_hash]

    @property
    def num_cached_blocks(self) -> int:
        return len(self._hash_of_block)
