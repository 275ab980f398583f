"""What the roles share about the job's state: how a model is cut into blocks and read or
written through them (`blocks`), the optimizer's spec, the user's schedule and the
global gradient norm (`optimizer`), the checkpoint format (`checkpoint`), an update's step
totals (`steps`) and the typed reader of a message's optional fields (`fields`)."""
