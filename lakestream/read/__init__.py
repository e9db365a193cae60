"""The read side: reading fragments' rows, and the steps readers take (a stream's own, a mix,
a read-time policy's) over the planners and the log (docs/design.md §11)."""
