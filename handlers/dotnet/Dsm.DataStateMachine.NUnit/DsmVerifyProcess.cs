// Runs one `dsm verify` as a child process and keeps what it printed.
//
// The arguments go to dsm one by one: under .NET through ProcessStartInfo.ArgumentList;
// under Mono, whose Process reads ProcessStartInfo.Arguments with POSIX shell quoting (and
// ignores ArgumentList), each one single-quoted. A handler command with spaces, quotes or
// backslashes reaches dsm's --exec as written either way.

using System;
using System.Collections.Generic;
using System.ComponentModel;
using System.Diagnostics;
using System.Text;

namespace Dsm.DataStateMachine.Testing
{
    /// <summary>What one dsm verify process did: its exit status and everything it printed.</summary>
    internal sealed class DsmVerifyOutcome
    {
        public DsmVerifyOutcome(int exitCode, string stdout, string stderr)
        {
            ExitCode = exitCode;
            Stdout = stdout;
            Stderr = stderr;
        }

        public int ExitCode { get; }
        public string Stdout { get; }
        public string Stderr { get; }
    }

    internal static class DsmVerifyProcess
    {
        /// <summary>Runs <paramref name="executable"/> with <paramref name="arguments"/> to its end.</summary>
        public static DsmVerifyOutcome Run(string executable, IList<string> arguments, string workingDirectory, TimeSpan? timeout)
        {
            var start = new ProcessStartInfo(executable)
            {
                UseShellExecute = false,
                RedirectStandardInput = true,
                RedirectStandardOutput = true,
                RedirectStandardError = true,
                StandardOutputEncoding = Encoding.UTF8,
                StandardErrorEncoding = Encoding.UTF8,
                WorkingDirectory = workingDirectory,
            };
#if NETCOREAPP
            foreach (var argument in arguments) start.ArgumentList.Add(argument);
#else
            start.Arguments = PosixWords(arguments);
#endif
            var stdout = new StringBuilder();
            var stderr = new StringBuilder();
            Process process;
            try
            {
                process = Process.Start(start);
            }
            catch (Win32Exception error)
            {
                throw new DsmNotStartedException(executable, error.Message, error);
            }
            if (process == null) throw new DsmNotStartedException(executable, "Process.Start started nothing", null);
            using (process)
            {
                process.OutputDataReceived += (sender, line) => Keep(stdout, line.Data);
                process.ErrorDataReceived += (sender, line) => Keep(stderr, line.Data);
                process.BeginOutputReadLine();
                process.BeginErrorReadLine();
                process.StandardInput.Close();
                int waitMs = timeout.HasValue ? (int)Math.Min(int.MaxValue, timeout.Value.TotalMilliseconds) : -1;
                if (!process.WaitForExit(waitMs))
                {
                    try
                    {
                        process.Kill();
                    }
                    catch (InvalidOperationException)
                    {
                        // It ended between the wait and the kill.
                    }
                    throw new DsmVerifyTimedOutException(CommandLine(executable, arguments), timeout.Value);
                }
                process.WaitForExit(); // the last lines of both streams
                return new DsmVerifyOutcome(process.ExitCode, Text(stdout), Text(stderr));
            }
        }

        /// <summary>The command as a POSIX shell reads it, for messages and the log.</summary>
        public static string CommandLine(string executable, IEnumerable<string> arguments)
        {
            var words = new List<string> { executable };
            words.AddRange(arguments);
            return PosixWords(words);
        }

        private static string PosixWords(IEnumerable<string> words)
        {
            var line = new StringBuilder();
            foreach (var word in words)
            {
                if (line.Length > 0) line.Append(' ');
                line.Append(PosixWord(word));
            }
            return line.ToString();
        }

        private static string PosixWord(string word)
        {
            foreach (char c in word)
            {
                if (!(char.IsLetterOrDigit(c) || "-_./:=,@%+".IndexOf(c) >= 0)) return "'" + word.Replace("'", "'\\''") + "'";
            }
            return word.Length == 0 ? "''" : word;
        }

        private static void Keep(StringBuilder into, string line)
        {
            if (line == null) return;
            lock (into)
            {
                into.Append(line).Append('\n');
            }
        }

        private static string Text(StringBuilder from)
        {
            lock (from)
            {
                return from.ToString();
            }
        }
    }
}
