"""The write side: verdicts (:mod:`.verdicts`), planning (:mod:`.plan`) and the transaction
(:mod:`.transaction`), behind the three commands in :mod:`.commands`."""
