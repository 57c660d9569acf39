"""Role playbooks as data, installed as afddiag.playbooks."""
