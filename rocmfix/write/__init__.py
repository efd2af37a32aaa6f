"""The write side: verdicts (:mod:`.verdicts`), planning (:mod:`.plan`) and the transaction
(:mod:`.transaction`), behind the three commands in :mod:`.commands`."""

from rocmfix.write.commands import apply, refuse_if_busy, revert, status

__all__ = ["apply", "refuse_if_busy", "revert", "status"]
