"""The evaluation suite: StayHub guest conversations with expected outcomes, run against the product's own stack."""
