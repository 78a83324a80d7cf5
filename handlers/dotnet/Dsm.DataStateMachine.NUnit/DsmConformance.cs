// dsm verify as NUnit test cases in a team's own test project: one case per property the
// kit judges, and one for the parts of the run that are no property ("gaps").
//
//   [TestFixture]
//   public class MyHandlerConformance
//   {
//       private static readonly DsmConformance Dsm = new DsmConformance("dotnet MyHandler.Verify.dll");
//
//       [TestCaseSource(typeof(DsmConformance), "Cases")]
//       public void Property(string name) { Dsm.Check(name); }
//   }
//
// The cases are known before anything runs (DsmProperties), so discovering the tests starts
// no verification. The first case that runs starts `dsm verify --exec COMMAND --json FILE`
// once; every case of the fixture then reads its verdict from that one report.

using System;
using System.Collections.Generic;
using System.IO;
using System.Text;
using System.Threading;
using NUnit.Framework;

namespace Dsm.DataStateMachine.Testing
{
    /// <summary>How dsm judges the handler's fencing tokens (<c>--tokens</c>).</summary>
    public enum TokenRule
    {
        /// <summary>A token is the record's attempt: 1, 2, 3... (dsm's default).</summary>
        Attempts,
        /// <summary>Any value that grows with every grant of an item: judged by order, not by value.</summary>
        Ordered,
    }

    public sealed class DsmConformance
    {
        /// <summary>The environment variable naming the dsm executable; without it, dsm on PATH.</summary>
        public const string CommandVariable = "DSM_COMMAND";

        /// <summary>The case for what is no property: gaps not waived, a run that did not complete.</summary>
        public const string GapsCase = "gaps";

        private readonly Lazy<VerifyReport> report;

        /// <param name="handlerCommand">
        /// The command that starts the handler behind the protocol host, as dsm verify --exec takes
        /// it (e.g. "dotnet MyHandler.Verify.dll", "mono --debug MyHandler.exe"); it runs from
        /// <see cref="WorkingDirectory"/>.
        /// </param>
        public DsmConformance(string handlerCommand)
        {
            if (string.IsNullOrWhiteSpace(handlerCommand))
            {
                throw new ArgumentException("the handler command is empty: give the command that starts your handler's Main, e.g. \"dotnet MyHandler.Verify.dll\"", "handlerCommand");
            }
            HandlerCommand = handlerCommand;
            ExtraArguments = new List<string>();
            DsmCommand = Environment.GetEnvironmentVariable(CommandVariable);
            if (string.IsNullOrEmpty(DsmCommand)) DsmCommand = "dsm";
            WorkingDirectory = AppDomain.CurrentDomain.BaseDirectory;
            report = new Lazy<VerifyReport>(Run, LazyThreadSafetyMode.ExecutionAndPublication);
        }

        public string HandlerCommand { get; }

        /// <summary>dev (seconds), ci (dsm's default, the bar), thorough (minutes); null for dsm's default.</summary>
        public string Profile { get; set; }

        /// <summary>The seed of the search: the same test cases every run. Null: dsm draws one and reports it.</summary>
        public long? Seed { get; set; }

        /// <summary>Null for dsm's default (<see cref="TokenRule.Attempts"/>).</summary>
        public TokenRule? Tokens { get; set; }

        /// <summary>More dsm verify options, word by word: "--waive", "peers", "--exec-timeout", "30", "--stop-on-first".</summary>
        public IList<string> ExtraArguments { get; }

        /// <summary>The dsm executable: DSM_COMMAND when set, else dsm on PATH.</summary>
        public string DsmCommand { get; set; }

        /// <summary>Where dsm and the handler command run: by default the test assembly's directory.</summary>
        public string WorkingDirectory { get; set; }

        /// <summary>
        /// Where the report (dsm-verify.json), dsm's output (dsm-verify.log) and the
        /// counterexamples (replays/) go; emptied of them before the run. By default a folder
        /// under NUnit's work directory named after the handler command.
        /// </summary>
        public string OutputDirectory { get; set; }

        /// <summary>Stop dsm after this long (null: wait; dsm's own --max-wall bounds the run).</summary>
        public TimeSpan? Timeout { get; set; }

        /// <summary>The report of the one run, started by the first case that asks.</summary>
        public VerifyReport Report
        {
            get { return report.Value; }
        }

        /// <summary>One case per property, then <see cref="GapsCase"/>: for [TestCaseSource(typeof(DsmConformance), "Cases")].</summary>
        public static IEnumerable<TestCaseData> Cases()
        {
            foreach (var property in DsmProperties.All)
            {
                yield return new TestCaseData(property.Name).SetName(property.Name).SetDescription(property.Summary);
            }
            yield return new TestCaseData(GapsCase).SetName(GapsCase)
                .SetDescription("every part of the verification ran (peers, race matrix, edge probes, the wall-clock limit), or is waived");
        }

        /// <summary>
        /// Passes, fails, or is ignored or inconclusive as the report judged <paramref name="name"/>
        /// (see docs/dotnet.md, "Run the kit from your NUnit project").
        /// </summary>
        public void Check(string name)
        {
            var verdicts = new CaseVerdicts(Report, HandlerCommand, ReplayDirectory, LogPath);
            if (name == GapsCase) verdicts.Gaps();
            else verdicts.Property(name);
        }

        /// <summary>The words after the dsm executable.</summary>
        public IList<string> Arguments()
        {
            var words = new List<string> { "verify", "--exec", HandlerCommand, "--json", ReportPath, "--replay-dir", ReplayDirectory };
            if (Profile != null) words.AddRange(new[] { "--profile", Profile });
            if (Seed.HasValue) words.AddRange(new[] { "--seed", Seed.Value.ToString(System.Globalization.CultureInfo.InvariantCulture) });
            if (Tokens.HasValue) words.AddRange(new[] { "--tokens", Tokens.Value == TokenRule.Ordered ? "ordered" : "attempts" });
            words.AddRange(ExtraArguments);
            return words;
        }

        private string Output
        {
            get
            {
                if (OutputDirectory == null) OutputDirectory = Path.Combine(TestContext.CurrentContext.WorkDirectory, "dsm-verify", FolderName(HandlerCommand));
                return OutputDirectory;
            }
        }

        private string ReportPath
        {
            get { return Path.Combine(Output, "dsm-verify.json"); }
        }

        private string LogPath
        {
            get { return Path.Combine(Output, "dsm-verify.log"); }
        }

        private string ReplayDirectory
        {
            get { return Path.Combine(Output, "replays"); }
        }

        private VerifyReport Run()
        {
            Directory.CreateDirectory(Output);
            // A report or a counterexample of an earlier run is never read as this run's.
            File.Delete(ReportPath);
            File.Delete(LogPath);
            if (Directory.Exists(ReplayDirectory)) Directory.Delete(ReplayDirectory, true);
            var arguments = Arguments();
            string commandLine = DsmVerifyProcess.CommandLine(DsmCommand, arguments);
            var outcome = DsmVerifyProcess.Run(DsmCommand, arguments, WorkingDirectory, Timeout);
            File.WriteAllText(LogPath, "$ " + commandLine + "\n(exit " + outcome.ExitCode + ")\n" + outcome.Stdout + outcome.Stderr, new UTF8Encoding(false));
            if (outcome.ExitCode == 2) throw new DsmVerifyRefusedException(commandLine, outcome.ExitCode, Tail(outcome.Stderr));
            if (outcome.ExitCode != 0 && outcome.ExitCode != 1)
            {
                throw new DsmReportUnreadableException(ReportPath, "was not read: dsm verify exited " + outcome.ExitCode + " (0 is PASSED, 1 NOT PASSED)", Tail(outcome.Stderr));
            }
            return VerifyReport.Read(ReportPath, Tail(outcome.Stderr));
        }

        /// <summary>The last lines dsm wrote on stderr: its error, or the end of a traceback.</summary>
        private static string Tail(string text)
        {
            var lines = text.TrimEnd().Split('\n');
            int from = Math.Max(0, lines.Length - 12);
            return string.Join("\n", lines, from, lines.Length - from);
        }

        /// <summary>A folder name for the command: its letters and digits, and a hash that tells commands apart.</summary>
        private static string FolderName(string command)
        {
            var name = new StringBuilder();
            foreach (char c in command)
            {
                bool keep = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9');
                if (keep) name.Append(c);
                else if (name.Length > 0 && name[name.Length - 1] != '-') name.Append('-');
                if (name.Length >= 48) break;
            }
            uint hash = 2166136261; // FNV-1a: the same folder for the same command in every process
            foreach (char c in command) hash = (hash ^ c) * 16777619;
            return name.ToString().Trim('-') + "-" + hash.ToString("x8");
        }
    }
}
