// The JSON report `dsm verify --json FILE` writes (dsm_sim/conformance/tell/outputs.py,
// report_dict): the members a test case needs, read with the framework's own
// DataContractJsonSerializer (no package; members the report adds later are skipped).

using System;
using System.Collections.Generic;
using System.IO;
using System.Runtime.Serialization;
using System.Runtime.Serialization.Json;

namespace Dsm.DataStateMachine.Testing
{
    /// <summary>One dsm verify run: its verdict, one result per property, and what did not run.</summary>
    [DataContract]
    public sealed class VerifyReport
    {
        /// <summary>What every dsm verify report says in <c>tool</c>.</summary>
        public const string Tool = "dsm verify";

        [DataMember(Name = "tool")] public string ToolName { get; set; }
        [DataMember(Name = "factory")] public string Factory { get; set; }
        [DataMember(Name = "profile")] public string Profile { get; set; }
        [DataMember(Name = "seed")] public long Seed { get; set; }
        [DataMember(Name = "semantics")] public string Semantics { get; set; }
        /// <summary>dsm's one-line verdict: PASSED, FAILED (...), NOT PASSED (...).</summary>
        [DataMember(Name = "verdict")] public string Verdict { get; set; }
        [DataMember(Name = "passed")] public bool Passed { get; set; }
        /// <summary>Why the run did not complete, or null.</summary>
        [DataMember(Name = "error")] public string Error { get; set; }
        [DataMember(Name = "seconds")] public double Seconds { get; set; }
        [DataMember(Name = "tokens")] public string Tokens { get; set; }
        [DataMember(Name = "properties")] public List<PropertyReport> Properties { get; set; }
        [DataMember(Name = "hazards")] public List<HazardReport> Hazards { get; set; }
        [DataMember(Name = "gaps")] public List<GapReport> Gaps { get; set; }
        /// <summary>The dsm verify command that runs the same test cases again.</summary>
        [DataMember(Name = "replay")] public string Replay { get; set; }

        /// <summary>The property's result, or null when the report has none of that name.</summary>
        public PropertyReport Property(string name)
        {
            foreach (var property in Properties)
            {
                if (property.Name == name) return property;
            }
            return null;
        }

        /// <summary>Reads the report at <paramref name="path"/>; <paramref name="said"/> is quoted when it cannot.</summary>
        public static VerifyReport Read(string path, string said)
        {
            if (!File.Exists(path)) throw new DsmReportUnreadableException(path, "was not written", said);
            VerifyReport report;
            try
            {
                using (var stream = File.OpenRead(path))
                {
                    report = (VerifyReport)new DataContractJsonSerializer(typeof(VerifyReport)).ReadObject(stream);
                }
            }
            catch (Exception error) when (error is SerializationException || error is InvalidCastException || error is IOException)
            {
                throw new DsmReportUnreadableException(path, "is not JSON a dsm verify report has: " + error.Message, said, error);
            }
            if (report == null || report.ToolName != Tool)
            {
                throw new DsmReportUnreadableException(path, "is not a dsm verify report (its \"tool\" is not \"" + Tool + "\")", said);
            }
            if (report.Properties == null)
            {
                throw new DsmReportUnreadableException(path, "has no \"properties\" list", said);
            }
            if (report.Hazards == null) report.Hazards = new List<HazardReport>();
            if (report.Gaps == null) report.Gaps = new List<GapReport>();
            return report;
        }
    }

    /// <summary>One property's result: <c>status</c> is passed, failed, flaky, not exercised, unsettled or waived.</summary>
    [DataContract]
    public sealed class PropertyReport
    {
        public const string PassedStatus = "passed";
        public const string FailedStatus = "failed";
        public const string FlakyStatus = "flaky";
        public const string NotExercisedStatus = "not exercised";
        public const string UnsettledStatus = "unsettled";
        public const string WaivedStatus = "waived";

        [DataMember(Name = "name")] public string Name { get; set; }
        [DataMember(Name = "summary")] public string Summary { get; set; }
        [DataMember(Name = "status")] public string Status { get; set; }
        [DataMember(Name = "checks")] public long Checks { get; set; }
        /// <summary>Later test cases stopped at this violation once it was known.</summary>
        [DataMember(Name = "stopped")] public long Stopped { get; set; }
        /// <summary>The violation in one sentence; for a waived property, why it does not apply.</summary>
        [DataMember(Name = "message")] public string Message { get; set; }
        /// <summary>The shrunk steps, numbered, in plain language.</summary>
        [DataMember(Name = "story")] public string Story { get; set; }
        /// <summary>An edge probe's name, "race matrix", or null (the search found it).</summary>
        [DataMember(Name = "found_by")] public string FoundBy { get; set; }
        [DataMember(Name = "found_seed")] public long? FoundSeed { get; set; }
        /// <summary>Replays of the steps that broke the property again, and replays tried.</summary>
        [DataMember(Name = "confirmed")] public long[] Confirmed { get; set; }
    }

    /// <summary>A hazard of the semantics profile (what its interface cannot prevent) that a test case showed.</summary>
    [DataContract]
    public sealed class HazardReport
    {
        [DataMember(Name = "name")] public string Name { get; set; }
        [DataMember(Name = "summary")] public string Summary { get; set; }
        /// <summary>The property whose check showed it.</summary>
        [DataMember(Name = "property")] public string Property { get; set; }
        [DataMember(Name = "message")] public string Message { get; set; }
        [DataMember(Name = "story")] public string Story { get; set; }
        [DataMember(Name = "test_cases")] public long TestCases { get; set; }
    }

    /// <summary>A part of the verification that did not run (peers, matrix, probe:NAME, max-wall).</summary>
    [DataContract]
    public sealed class GapReport
    {
        [DataMember(Name = "name")] public string Name { get; set; }
        [DataMember(Name = "what")] public string What { get; set; }
        [DataMember(Name = "reason")] public string Reason { get; set; }
        [DataMember(Name = "waived")] public bool Waived { get; set; }
    }
}
