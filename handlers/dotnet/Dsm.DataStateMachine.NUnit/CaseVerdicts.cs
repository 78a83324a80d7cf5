// How each status of the report ends its NUnit case, so that the fixture is red exactly
// when dsm verify's verdict is not PASSED:
//
//   passed          -> passes (Assert.Pass, with the checks that held)
//   failed, flaky   -> fails with the finding, its story, the replay command and files
//   not exercised   -> fails: a green verdict needs every property exercised, or waived
//   waived          -> ignored, with why (the profile's reason or the user's --waive)
//   unsettled       -> inconclusive: --stop-on-first ended the run before it was settled
//
// The gaps case fails for each gap not waived, a property this assembly has no case for,
// and a run that did not complete.

using System.Collections.Generic;
using System.IO;
using System.Text;
using NUnit.Framework;

namespace Dsm.DataStateMachine.Testing
{
    internal sealed class CaseVerdicts
    {
        private readonly VerifyReport report;
        private readonly string handlerCommand;
        private readonly string replayDirectory;
        private readonly string logPath;

        public CaseVerdicts(VerifyReport report, string handlerCommand, string replayDirectory, string logPath)
        {
            this.report = report;
            this.handlerCommand = handlerCommand;
            this.replayDirectory = replayDirectory;
            this.logPath = logPath;
        }

        public void Property(string name)
        {
            var result = report.Property(name);
            if (result == null)
            {
                Assert.Fail("the dsm verify report has no property " + name + ": the dsm that ran (" + report.Factory
                    + ") judges other properties than this assembly lists; use the dsm and Dsm.DataStateMachine.NUnit of one checkout");
            }
            if (report.Error != null && !IsFailure(result.Status))
            {
                Assert.Fail(name + " is not settled: dsm verify did not complete: " + report.Error + "\n(" + result.Status + " after "
                    + result.Checks + " checks; dsm's output: " + logPath + ")");
            }
            switch (result.Status)
            {
                case PropertyReport.PassedStatus:
                    Assert.Pass(name + ": " + result.Checks + " checks held" + Hazards(name));
                    break;
                case PropertyReport.FailedStatus:
                case PropertyReport.FlakyStatus:
                    Assert.Fail(Violation(result));
                    break;
                case PropertyReport.NotExercisedStatus:
                    Assert.Fail("NOT EXERCISED " + name + ": no test case reached it (" + result.Summary + "). dsm's verdict is PASSED only"
                        + " when every property was exercised: run a larger Profile or another Seed, or accept it by name with"
                        + " ExtraArguments \"--waive\", \"" + name + "\".");
                    break;
                case PropertyReport.WaivedStatus:
                    Assert.Ignore("waived: " + result.Message + Hazards(name));
                    break;
                case PropertyReport.UnsettledStatus:
                    Assert.Inconclusive(name + " unsettled: the run stopped at an earlier violation (--stop-on-first) before settling it ("
                        + result.Checks + " checks held until then)");
                    break;
                default:
                    Assert.Fail(name + " has the status '" + result.Status + "', which this assembly does not know: use the dsm and"
                        + " Dsm.DataStateMachine.NUnit of one checkout");
                    break;
            }
        }

        public void Gaps()
        {
            var lines = new List<string>();
            if (report.Error != null) lines.Add("dsm verify did not complete: " + report.Error);
            var waived = new List<string>();
            foreach (var gap in report.Gaps)
            {
                string line = gap.Name + ": " + gap.What + ": " + gap.Reason;
                if (gap.Waived) waived.Add("waived " + line);
                else lines.Add("NOT EXERCISED " + line);
            }
            foreach (var property in report.Properties)
            {
                if (!DsmProperties.Known(property.Name))
                {
                    lines.Add("the report judges " + property.Name + " (" + property.Status + ": " + (property.Message ?? property.Summary)
                        + "), a property this assembly has no case for: use the dsm and Dsm.DataStateMachine.NUnit of one checkout");
                }
            }
            if (lines.Count > 0)
            {
                lines.Add("dsm's verdict: " + report.Verdict + " (a gap is accepted by name with ExtraArguments \"--waive\", NAME; dsm's output: " + logPath + ")");
                Assert.Fail(string.Join("\n", lines));
            }
            Assert.Pass(waived.Count == 0 ? "every part of the verification ran" : string.Join("\n", waived));
        }

        private static bool IsFailure(string status)
        {
            return status == PropertyReport.FailedStatus || status == PropertyReport.FlakyStatus;
        }

        private string Violation(PropertyReport result)
        {
            bool flaky = result.Status == PropertyReport.FlakyStatus;
            var text = new StringBuilder();
            text.Append(result.Name).Append(" violated").Append(flaky ? " (flaky)" : "").Append(": ").Append(result.Message);
            if (flaky && result.Confirmed != null && result.Confirmed.Length == 2)
            {
                text.Append("\n(it failed ").Append(result.Confirmed[0]).Append(" of ").Append(result.Confirmed[1])
                    .Append(" replays of these steps: a race, most likely)");
            }
            if (result.FoundBy != null)
            {
                text.Append("\nFound by ").Append(result.FoundBy == "race matrix" ? "the race matrix" : "the edge probe '" + result.FoundBy + "'")
                    .Append(", before the search.");
            }
            if (!string.IsNullOrEmpty(result.Story)) text.Append("\n\nWhat happened:\n").Append(result.Story);
            if (result.Stopped > 0)
            {
                text.Append("\n\n").Append(result.Stopped).Append(" later test case(s) stopped at this violation: the other properties'")
                    .Append(" passes hold for what ran before it.");
            }
            text.Append("\n\nThe same test cases again: ").Append(report.Replay);
            string stem = Path.Combine(replayDirectory, Safe(result.Name) + "-seed" + (result.FoundSeed ?? 0));
            if (File.Exists(stem + ".jsonl"))
            {
                text.Append("\nThe protocol requests: ").Append(stem).Append(".jsonl (dsm replay FILE --exec \"").Append(handlerCommand).Append("\")");
            }
            if (File.Exists(stem + ".cs")) text.Append("\nThe same steps as an NUnit test: ").Append(stem).Append(".cs");
            text.Append("\ndsm's output: ").Append(logPath);
            return text.ToString();
        }

        /// <summary>Each hazard a test case showed through this property, with its shortest story.</summary>
        private string Hazards(string name)
        {
            var text = new StringBuilder();
            foreach (var hazard in report.Hazards)
            {
                if (hazard.Property != name) continue;
                text.Append("\nhazard ").Append(hazard.Name).Append(": ").Append(hazard.Summary)
                    .Append("\n  shown by ").Append(hazard.TestCases).Append(" test case(s); the shortest: ").Append(hazard.Message);
                if (!string.IsNullOrEmpty(hazard.Story)) text.Append("\n\nWhat happened:\n").Append(hazard.Story);
            }
            return text.ToString();
        }

        /// <summary>The property's name as dsm names its replay files (dsm_sim/protocol/replay.py, replay_name).</summary>
        private static string Safe(string name)
        {
            var safe = new StringBuilder();
            bool replacing = false;
            foreach (char c in name)
            {
                bool keep = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' || c == '.' || c == '-';
                if (keep) safe.Append(c);
                else if (!replacing) safe.Append('-');
                replacing = !keep;
            }
            return safe.ToString();
        }
    }
}
