"""Page pool: hands out physical page indices. Page 0 is the null page."""

from __future__ import annotations

from ssmstate.errors import CapacityError, SSMStateError

NULL_PAGE = 0


class PagePool:
    """A free list of pages ``1 .. num_pages - 1``; page 0 is never handed out.

    Padding rows of a batch point at page 0, so kernels skip it and nothing
    writes it. ``allocate`` and ``free`` are O(1) per page.
    """

    def __init__(self, num_pages: int) -> None:
        if not isinstance(num_pages, int) or num_pages < 1:
            raise SSMStateError(f"num_pages must be an int >= 1 (page 0 is the null page), got {num_pages!r}")
        self.num_pages = num_pages
        # Pop from the end: low page ids first, which keeps tests readable.
        self._free: list[int] = list(range(num_pages - 1, 0, -1))
        self._used = bytearray(num_pages)

    @property
    def num_free(self) -> int:
        return len(self._free)

    @property
    def num_used(self) -> int:
        return self.num_pages - 1 - len(self._free)

    def can_allocate(self, n: int = 1) -> bool:
        return 0 <= n <= len(self._free)

    def allocate(self, n: int = 1) -> list[int]:
        if n < 0:
            raise SSMStateError(f"cannot allocate {n} pages")
        if n > len(self._free):
            raise CapacityError("page pool is full", required=n, available=len(self._free))
        pages = [self._free.pop() for _ in range(n)]
        for p in pages:
            self._used[p] = 1
        return pages

    def free(self, pages: list[int] | tuple[int, ...]) -> None:
        seen: set[int] = set()
        for p in pages:
            if p == NULL_PAGE:
                raise SSMStateError("page 0 is the null page and is never freed")
            if not (0 < p < self.num_pages) or not self._used[p] or p in seen:
                raise SSMStateError(f"page {p} is not allocated (double free?)")
            seen.add(p)
        for p in pages:
            self._used[p] = 0
            self._free.append(p)

    def is_allocated(self, page: int) -> bool:
        return 0 < page < self.num_pages and bool(self._used[page])
