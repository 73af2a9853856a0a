"""`cod_pde_discovery_workflow`: find the hidden reaction term f(u) of u_t = u_xx + f(u) (Trinity v0.6's
CoDPDEDiscoveryWorkflow, also resolved under its dotted path).

terms.py is the basis library and the equation grammar; simulate.py the hidden PDE's numerics;
families.py the hidden equations a pack may get; regression.py the sparse regression the agent
calls; lab.py the environment (its four actions); prompts.py what the model reads; workflow.py the
episode.
"""
