// Why a conformance fixture has no verdict to report: dsm did not start, refused the run,
// did not finish in time, or left a report that cannot be read. Each message says what was
// wrong and what to do; every case of the fixture fails with it.

using System;

namespace Dsm.DataStateMachine.Testing
{
    /// <summary>The root of what stops <see cref="DsmConformance"/> from having a verdict.</summary>
    public abstract class DsmConformanceException : Exception
    {
        protected DsmConformanceException(string message, Exception inner = null) : base(message, inner)
        {
        }
    }

    /// <summary>The dsm executable could not be started (not installed, not on PATH, not executable).</summary>
    public sealed class DsmNotStartedException : DsmConformanceException
    {
        public DsmNotStartedException(string executable, string reason, Exception inner)
            : base("dsm could not be started as '" + executable + "': " + reason + ". Install dsm (python3 -m pip install -e '.[dev]'"
                + " in a checkout of it) so that 'dsm' is on PATH, or set " + DsmConformance.CommandVariable
                + " (or DsmConformance.DsmCommand) to the dsm executable, e.g. .venv/bin/dsm", inner)
        {
            Executable = executable;
        }

        /// <summary>What was started: DSM_COMMAND, or dsm on PATH.</summary>
        public string Executable { get; }
    }

    /// <summary>
    /// dsm verify exited with a usage error (2): an option it does not take, a handler command
    /// that does not start, a report path it cannot write. Its own message says which.
    /// </summary>
    public sealed class DsmVerifyRefusedException : DsmConformanceException
    {
        public DsmVerifyRefusedException(string commandLine, int exitCode, string said)
            : base("dsm verify refused the run (exit " + exitCode + "): " + said + "\nThe command was: " + commandLine
                + "\nFix what dsm says (the handler command runs from DsmConformance.WorkingDirectory) and run the tests again.")
        {
            CommandLine = commandLine;
            ExitCode = exitCode;
        }

        public string CommandLine { get; }
        public int ExitCode { get; }
    }

    /// <summary>dsm verify ran longer than <see cref="DsmConformance.Timeout"/> and was stopped.</summary>
    public sealed class DsmVerifyTimedOutException : DsmConformanceException
    {
        public DsmVerifyTimedOutException(string commandLine, TimeSpan timeout)
            : base("dsm verify ran longer than " + timeout + " and was stopped: " + commandLine
                + "\nGive it a longer DsmConformance.Timeout, a smaller profile, or --max-wall SECONDS in ExtraArguments"
                + " (past it dsm reports what did not run as NOT EXERCISED instead of being stopped).")
        {
            CommandLine = commandLine;
            Timeout = timeout;
        }

        public string CommandLine { get; }
        public TimeSpan Timeout { get; }
    }

    /// <summary>The JSON report dsm verify should have written is missing or is not a dsm verify report.</summary>
    public sealed class DsmReportUnreadableException : DsmConformanceException
    {
        public DsmReportUnreadableException(string path, string problem, string said, Exception inner = null)
            : base("the dsm verify report " + path + " " + problem + (string.IsNullOrEmpty(said) ? "" : "\ndsm said: " + said)
                + "\nRun the command of the log beside it by hand to see what dsm does; a dsm older than this assembly may write"
                + " another report: use the dsm of the same checkout.", inner)
        {
            Path = path;
            Problem = problem;
        }

        public string Path { get; }
        public string Problem { get; }
    }
}
