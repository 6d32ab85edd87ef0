"""What the tests share that is neither a fixture (tests/conftest.py) nor an oracle (oracles/): where the
checkout and the data are (`paths`), members and passes run the engine's way (`members`), the harness's prompts
(`prompts`), runs in the runner's format (`runs`), a script run in the test process (`run_in_process`), the
paper's pair in shape (`paper_pair`), a tiny PairRM (`pairrm_checkpoint`), hub-shaped data files (`hub_shapes`),
Triton tests run under its interpreter (`interpreter`) and the bad inputs' situations (`bad_inputs`). Only tests
import it."""
