# Tests that take a minute or more in a release build (sweeps over the whole paper suite), or
# several minutes under the sanitizers (planning many frontiers at -O1), get the label `slow`;
# the sanitizer job in .ci/run skips them (ctest -LE slow), the release run keeps them. Read by
# ctest after the discovered gtest tests (TEST_INCLUDE_FILES order); names that no longer exist
# are ignored.
set_tests_properties(
  Plan.ReplayMatchesPredictionOnEveryPaperWorkload
  Eval.PaperSuite
  Plan.PerLayerNeverWorseAndReplays
  Calibration.FitReproducesCommittedDefaults
  Zoo.NeverWorseThanBaselinesAndHonestFastEnds
  Zoo.MixtureOfExpertsNeverWorseThanBaselines
  Eval.KareusOwnFrontierAgainstBaselines
  PlanFrom.SamePlanAsRecomputingAndClearErrors
  PROPERTIES LABELS slow)
# The whole calibration with the artifact's frontier ends: about 8 minutes on one core of the
# development machine, more beside other tests.
set_tests_properties(Calibration.FitReproducesCommittedDefaults PROPERTIES TIMEOUT 1800)
