"""Byte quantities: the one definition of a MiB for every module that shows or reads sizes in
MiB (memsim's and memest's are `simulator::units` and `trace::units`)."""

from __future__ import annotations

# Bytes in a MiB: the unit of every `*_mib` field the tools write and read.
MIB = 1 << 20
