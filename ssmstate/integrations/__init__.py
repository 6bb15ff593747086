"""Engine integrations. Each submodule imports its engine; ``ssmstate`` itself never does."""
