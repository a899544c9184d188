"""What the prefix cache does when the file system says no: the errors it tells apart (a full disk,
a read-only directory), the warning it gives and the counters it keeps."""
from __future__ import annotations

import errno
from dataclasses import dataclass


class PrefixCacheWarning(UserWarning):
    """A snapshot was found unusable (corrupt, truncated, foreign) and ignored."""


def disk_full(e: OSError) -> bool:
    return e.errno in (errno.ENOSPC, getattr(errno, "EDQUOT", -1))


def read_only_error(e: OSError) -> bool:
    """A write refused because the file system or the directory is read-only for this process."""
    return e.errno in (errno.EACCES, errno.EPERM, errno.EROFS)


@dataclass
class PrefixCacheStats:
    prefix_cache_queries: int = 0      # tokens looked up (vLLM counts tokens)
    prefix_cache_hits: int = 0         # tokens restored from disk
    lookups: int = 0
    restores: int = 0
    restore_s: float = 0.0
    prefill_s_saved: float = 0.0       # recorded prefill time of the restored tokens minus restore_s
    saves: int = 0
    save_s: float = 0.0
    bytes_written: int = 0
    bytes_read: int = 0
    evictions: int = 0
    ignored_bad: int = 0

    def as_dict(self) -> dict:
        d = dict(self.__dict__)
        d["hit_rate"] = self.prefix_cache_hits / self.prefix_cache_queries if self.prefix_cache_queries else 0.0
        return d
