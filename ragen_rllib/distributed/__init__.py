"""Distributed helpers: collectives between learners, FSDP2 sharding, the learner
group that gathers sharded state, and the wire format that carries weights
through Ray's object store. None of them imports the rest of the project."""
