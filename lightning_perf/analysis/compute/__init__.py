"""The compute half of the step: where the time that is not DataLoader wait goes."""
