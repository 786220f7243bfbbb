"""Training drafter heads (EAGLE, Medusa) by self-distillation from the target."""
